// Workflow files in and out: the graph as ComfyUI's API prompt, and loading ComfyUI UI
// workflows, API prompts, sdflow workflows and PNGs that carry one of them.
import { LiteGraph, LGraphEventMode, SubgraphNode } from "@comfyorg/litegraph";

/** A file or value that is not a workflow this editor can open; says where and why. */
export class WorkflowError extends Error {}

/** Follows a link back through bypassed nodes to the output that really feeds it. */
function resolveOrigin(graph, link) {
  let seen = 0;
  while (link && seen++ < 1000) {
    const origin = graph.getNodeById(link.origin_id);
    if (!origin || origin.mode === LGraphEventMode.NEVER) return null;
    if (origin.mode !== LGraphEventMode.BYPASS) return [String(origin.id), link.origin_slot];
    const type = origin.outputs?.[link.origin_slot]?.type;
    const through = (origin.inputs ?? []).findIndex((i) => i.link != null && i.type === type);
    if (through < 0) return null;
    link = graph.getLink(origin.inputs[through].link);
  }
  return null;
}

/**
 * The graph as ComfyUI's API prompt `{ id: { class_type, inputs, _meta } }`, and the types of
 * the nodes left out because the server has no such node (notes, other frontends' helpers).
 */
export function graphToPrompt(graph) {
  const prompt = {};
  const skipped = new Set();
  for (const node of graph._nodes) {
    if (node.mode === LGraphEventMode.NEVER || node.mode === LGraphEventMode.BYPASS) continue;
    if (!LiteGraph.registered_node_types[node.type]) {
      skipped.add(node.type);
      continue;
    }
    const inputs = {};
    for (const w of node.widgets ?? []) {
      if (w.sdflowSkip || w.sdflowControl || w.type === "button") continue;
      inputs[w.name] = w.value;
    }
    (node.inputs ?? []).forEach((input, slot) => {
      if (input.link == null) return;
      const origin = resolveOrigin(graph, graph.getLink(input.link));
      if (origin) inputs[input.name] = origin;
    });
    prompt[String(node.id)] = { class_type: node.type, inputs, _meta: { title: node.title } };
  }
  return { prompt, skipped: [...skipped] };
}

/** Places nodes in columns by their depth from the sources (API prompts have no layout). */
function layout(nodes, deps) {
  const depth = new Map();
  const visit = (id, stack = new Set()) => {
    if (depth.has(id)) return depth.get(id);
    if (stack.has(id)) return 0;
    stack.add(id);
    let d = 0;
    for (const from of deps.get(id) ?? []) if (nodes.has(from)) d = Math.max(d, visit(from, stack) + 1);
    depth.set(id, d);
    return d;
  };
  const columns = [];
  for (const id of nodes.keys()) (columns[visit(id)] ??= []).push(id);
  let x = 40;
  for (const column of columns) {
    if (!column) continue;
    let y = 60;
    let width = 0;
    for (const id of column) {
      const node = nodes.get(id);
      node.pos = [x, y];
      y += node.size[1] + LiteGraph.NODE_TITLE_HEIGHT + 40;
      width = Math.max(width, node.size[0]);
    }
    x += width + 60;
  }
}

function isLink(value) {
  return Array.isArray(value) && value.length === 2 && (typeof value[0] === "string" || typeof value[0] === "number") && Number.isInteger(value[1]);
}

/** Builds the graph from an API prompt (or an sdflow workflow's `nodes`). */
export function loadPrompt(graph, prompt, where) {
  if (!prompt || typeof prompt !== "object" || Array.isArray(prompt)) throw new WorkflowError(`${where}: "nodes" is not an object of nodes`);
  const entries = Object.entries(prompt);
  for (const [id, entry] of entries) {
    if (!entry || typeof entry !== "object" || typeof entry.class_type !== "string") throw new WorkflowError(`${where}: node "${id}" has no class_type`);
    if (!LiteGraph.registered_node_types[entry.class_type]) throw new WorkflowError(`${where}: node "${id}" is of type "${entry.class_type}", which this server does not have`);
    if (entry.inputs != null && (typeof entry.inputs !== "object" || Array.isArray(entry.inputs))) throw new WorkflowError(`${where}: node "${id}": "inputs" is not an object`);
  }
  graph.clear();
  const nodes = new Map();
  const deps = new Map();
  for (const [id, entry] of entries) {
    const node = LiteGraph.createNode(entry.class_type);
    if (entry._meta?.title) node.title = String(entry._meta.title);
    if (/^\d+$/.test(id) && !graph.getNodeById(Number(id))) node.id = Number(id);
    graph.add(node);
    nodes.set(id, node);
    deps.set(id, []);
  }
  for (const [id, entry] of entries) {
    const node = nodes.get(id);
    for (const [name, value] of Object.entries(entry.inputs ?? {})) {
      if (isLink(value)) {
        const from = nodes.get(String(value[0]));
        if (!from) throw new WorkflowError(`${where}: node "${id}" input "${name}" links to node "${value[0]}", which is not in the workflow`);
        if (!from.outputs?.[value[1]]) throw new WorkflowError(`${where}: node "${id}" input "${name}" links to output ${value[1]} of node "${value[0]}", which has ${from.outputs?.length ?? 0} outputs`);
        let slot = node.findInputSlot(name);
        if (slot < 0) {
          // a widget fed by a link: give it a slot, as ComfyUI does when converting a widget to an input
          node.addInput(name, from.outputs[value[1]].type, { widget: { name } });
          slot = node.inputs.length - 1;
        }
        from.connect(value[1], node, slot);
        deps.get(id).push(String(value[0]));
        continue;
      }
      const widget = node.widgets?.find((w) => w.name === name);
      if (!widget) continue; // ComfyUI keeps inputs a newer node version dropped; so do we
      widget.value = value;
    }
    node.setSize(node.computeSize());
    if (node.size[0] < 220) node.size[0] = 220;
  }
  layout(nodes, deps);
  graph.setDirtyCanvas(true, true);
}

/** Opens any workflow this editor reads; `where` names its source in errors. */
export function loadWorkflow(graph, data, where) {
  if (!data || typeof data !== "object" || Array.isArray(data)) throw new WorkflowError(`${where}: not a workflow (expected a JSON object)`);
  if (data.format === "sdflow") {
    if (data.format_version !== undefined && data.format_version !== 1) throw new WorkflowError(`${where}: sdflow format_version ${data.format_version} is newer than this editor reads (1)`);
    return loadPrompt(graph, data.nodes, where);
  }
  if (Array.isArray(data.nodes)) {
    const checkNodes = (nodes, at) => nodes.forEach((n, i) => {
      if (!n || typeof n !== "object" || typeof n.type !== "string" || n.id == null) throw new WorkflowError(`${where}: ${at}[${i}] has no id or type`);
      if (n.widgets_values != null && typeof n.widgets_values !== "object") throw new WorkflowError(`${where}: ${at}[${i}] (${n.type}): widgets_values is not a list`);
    });
    checkNodes(data.nodes, "nodes");
    if (data.links != null && !Array.isArray(data.links)) throw new WorkflowError(`${where}: "links" is not a list`);
    // Subgraph definitions: an instance's type is its definition's id.
    const definitions = data.definitions?.subgraphs ?? [];
    if (!Array.isArray(definitions)) throw new WorkflowError(`${where}: "definitions.subgraphs" is not a list`);
    definitions.forEach((d, i) => {
      const at = `definitions.subgraphs[${i}]`;
      if (!d || typeof d !== "object" || typeof d.id !== "string" || !Array.isArray(d.nodes)) throw new WorkflowError(`${where}: ${at} has no id or nodes`);
      for (const side of ["inputs", "outputs", "links"]) {
        if (d[side] != null && !Array.isArray(d[side])) throw new WorkflowError(`${where}: ${at} (${d.name ?? d.id}): "${side}" is not a list`);
      }
      checkNodes(d.nodes, `${at}.nodes`);
    });
    const defined = new Set(definitions.map((d) => d.id));
    const types = [...data.nodes, ...definitions.flatMap((d) => d.nodes)].map((n) => n.type);
    // A definition of an earlier workflow is not one of this one's (its type goes on configure).
    const known = (t) => defined.has(t) || (LiteGraph.registered_node_types[t] && !(LiteGraph.registered_node_types[t].prototype instanceof SubgraphNode));
    const missing = [...new Set(types.filter((t) => !known(t)))];
    const before = graph.serialize();
    try {
      graph.configure(data);
    } catch (e) {
      graph.configure(before);
      throw new WorkflowError(`${where}: not a workflow litegraph can open (${e.message})`);
    }
    graph.setDirtyCanvas(true, true);
    return missing.length ? `${where}: opened; node types this server does not have: ${missing.join(", ")}` : null;
  }
  const values = Object.values(data);
  if (values.length && values.every((v) => v && typeof v === "object" && typeof v.class_type === "string")) return loadPrompt(graph, data, where);
  throw new WorkflowError(`${where}: not a ComfyUI workflow, ComfyUI API prompt or sdflow workflow`);
}

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

/** The tEXt / uncompressed iTXt chunks of a PNG, keyword → text. */
export function pngText(bytes, where) {
  if (bytes.length < 8 || PNG_SIGNATURE.some((b, i) => bytes[i] !== b)) throw new WorkflowError(`${where}: not a PNG file`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const latin1 = new TextDecoder("latin1");
  const utf8 = new TextDecoder("utf-8");
  const texts = {};
  let at = 8;
  while (at + 8 <= bytes.length) {
    const length = view.getUint32(at);
    const type = latin1.decode(bytes.subarray(at + 4, at + 8));
    const start = at + 8;
    if (start + length + 4 > bytes.length) throw new WorkflowError(`${where}: PNG chunk "${type}" at byte ${at} runs past the end of the file`);
    const data = bytes.subarray(start, start + length);
    const nul = data.indexOf(0);
    if (type === "tEXt" && nul > 0) {
      texts[latin1.decode(data.subarray(0, nul))] = latin1.decode(data.subarray(nul + 1));
    } else if (type === "iTXt" && nul > 0 && data[nul + 1] === 0) {
      const lang = data.indexOf(0, nul + 3);
      const translated = lang < 0 ? -1 : data.indexOf(0, lang + 1);
      if (translated >= 0) texts[latin1.decode(data.subarray(0, nul))] = utf8.decode(data.subarray(translated + 1));
    } else if (type === "IEND") break;
    at = start + length + 4;
  }
  return texts;
}

function parseJson(text, where) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new WorkflowError(`${where}: not valid JSON (${e.message})`);
  }
}

/** Opens a dropped or picked file: a workflow JSON, or a PNG with `workflow` / `prompt` text. */
export async function loadFile(graph, file) {
  const where = file.name || "the file";
  const bytes = new Uint8Array(await file.arrayBuffer());
  const isPng = file.type === "image/png" || PNG_SIGNATURE.every((b, i) => bytes[i] === b);
  if (isPng) {
    const texts = pngText(bytes, where);
    if (texts.workflow) return loadWorkflow(graph, parseJson(texts.workflow, `${where} (workflow text)`), where);
    if (texts.prompt) return loadWorkflow(graph, parseJson(texts.prompt, `${where} (prompt text)`), where);
    throw new WorkflowError(`${where}: this PNG carries no workflow or prompt`);
  }
  return loadWorkflow(graph, parseJson(new TextDecoder().decode(bytes), where), where);
}
