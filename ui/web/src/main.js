// The editor: a litegraph canvas fed by the server's node catalogue, with a toolbar, a
// searchable node list, the queue and the output gallery, and live progress over the
// WebSocket.
import "@comfyorg/litegraph/style.css";
import "./style.css";
import { LiteGraph, LGraph, LGraphCanvas, LGraphGroup } from "@comfyorg/litegraph";
import * as api from "./api.js";
import { installMenus, modeShortcut, setOpenInstance } from "./menu.js";
import { applyControl, decorate, fitChoices, registerAll, showImage, view } from "./nodes.js";
import { addToGallery, queuePanel, restoreGallery } from "./queue.js";
import { allNodes, chainTitle, hasInstances, installSubgraphs, nodeChain } from "./subgraph.js";
import { mountLayer, placeTextareas } from "./textarea.js";
import { graphToPrompt, loadFile, loadWorkflow } from "./workflow.js";

const $ = (id) => document.getElementById(id);
const STORAGE_KEY = "sdflow.workflow";
// What a first visit opens, as ComfyUI opens its default graph.
const DEFAULT_TEMPLATE = "txt2img";

function newClientId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}
const clientId = sessionStorage.getItem("sdflow.clientId") || newClientId();
sessionStorage.setItem("sdflow.clientId", clientId);

const graph = new LGraph();
const canvasEl = $("graph-canvas");
const canvas = new LGraphCanvas(canvasEl, graph);
canvas.allow_searchbox = true;
canvas.show_info = false;
// A graph the size of txt2img fitted beside the side panels lands just under litegraph's
// 0.6, where it stops drawing text.
canvas.low_quality_zoom_threshold = 0.45;
// litegraph outlines the area at the graph's origin, which reads as a stray box.
canvas.render_canvas_border = false;
mountLayer($("canvas-wrap"));
canvas.onDrawForeground = () => placeTextareas(canvas);
installMenus(canvas, graph);
// Opening an instance fits its definition in view; going back restores the view left.
const subgraphs = installSubgraphs(graph, canvas, {
  crumbs: $("breadcrumb"),
  decorate,
  onEnter: (_shown, ds) => {
    if (!ds) return fitView();
    canvas.ds.scale = ds.scale;
    canvas.ds.offset[0] = ds.offset[0];
    canvas.ds.offset[1] = ds.offset[1];
    canvas.setDirty(true, true);
  },
});
setOpenInstance(subgraphs.open);

function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.dataset.kind = kind;
}

// The last run's outcome stays beside the queue count until the next run starts: the
// `status` message that follows every run would otherwise replace it at once.
let outcome = null;
let queueLeft = null;

function showOutcome() {
  const parts = [outcome?.text, queueLeft == null ? null : `queue: ${queueLeft}`].filter(Boolean);
  setStatus(parts.join(" · "), outcome?.kind ?? "");
}

/** Notices that must stay until read (status messages are replaced by the next event). */
function showNotice(lines) {
  const box = $("notice");
  $("notice-text").replaceChildren(...lines.map((line) => Object.assign(document.createElement("div"), { textContent: line })));
  box.hidden = !lines.length;
}
$("notice-close").onclick = () => showNotice([]);

function fitCanvas() {
  const wrap = $("canvas-wrap");
  canvas.resize(wrap.clientWidth, wrap.clientHeight);
  canvas.setDirty(true, true);
}
new ResizeObserver(fitCanvas).observe($("canvas-wrap"));

/** The canvas's size on the page: the area between the side panels. */
function viewSize() {
  const wrap = $("canvas-wrap");
  return [wrap.clientWidth, wrap.clientHeight];
}

/** The graph point at the middle of the visible canvas. */
function viewCentre() {
  const [w, h] = viewSize();
  return canvas.ds.convertCanvasToOffset([w / 2, h / 2]);
}

/** Zooms and pans so every node and group of the graph on view is in it (never zooming in past 100%). */
function fitView() {
  fitCanvas();
  const shown = canvas.graph;
  // A subgraph's input and output boundary nodes are not among its nodes.
  const items = [...shown._nodes, ...(shown._groups ?? []), ...[shown.inputNode, shown.outputNode].filter(Boolean)];
  if (!items.length) {
    canvas.ds.reset();
    canvas.setDirty(true, true);
    return;
  }
  let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
  for (const item of items) {
    // litegraph measures nodes at the start of each frame; a graph just opened has not had one
    item.updateArea?.(canvas.ctx);
    const [x, y, w, h] = item.boundingRect;
    x0 = Math.min(x0, x);
    y0 = Math.min(y0, y);
    x1 = Math.max(x1, x + w);
    y1 = Math.max(y1, y + h);
  }
  const [vw, vh] = viewSize();
  const margin = 30;
  const scale = Math.max(0.1, Math.min(1, (vw - 2 * margin) / (x1 - x0), (vh - 2 * margin) / (y1 - y0)));
  canvas.ds.scale = scale;
  canvas.ds.offset[0] = vw / 2 / scale - (x0 + x1) / 2;
  canvas.ds.offset[1] = vh / 2 / scale - (y0 + y1) / 2;
  canvas.setDirty(true, true);
}

/**
 * After any workflow is opened: nodes as large as their widgets need (saved sizes may be
 * smaller, and litegraph would grow them only when drawn, after the view was fitted), list
 * values this server lacks swapped for ones it has (said in the notice), the view fitted.
 */
function afterLoad() {
  for (const node of allNodes(graph)) {
    if (!LiteGraph.registered_node_types[node.type]) continue;
    const [w, h] = node.computeSize();
    if (node.size[0] < w || node.size[1] < h) node.setSize([Math.max(node.size[0], w), Math.max(node.size[1], h)]);
  }
  showNotice(fitChoices(allNodes(graph)));
  fitView();
}

// ---- validation and execution errors, shown on their nodes and listed at the side ----

function clearNodeErrors() {
  for (const node of allNodes(graph)) {
    node.sdflowErrors = null;
    node.has_errors = false;
  }
}

function clearErrors() {
  clearNodeErrors();
  const box = $("errors");
  box.hidden = true;
  box.replaceChildren();
  canvas.setDirty(true, true);
}

/**
 * Lists errors by execution id and draws them on their nodes: an inner node's ("11:5")
 * on it and on every instance holding it, so they show at whatever level is open.
 */
function showErrors(title, perNode) {
  clearNodeErrors();
  const box = $("errors");
  box.replaceChildren();
  const head = document.createElement("h2");
  head.textContent = title;
  box.append(head);
  for (const [id, messages] of Object.entries(perNode)) {
    const chain = nodeChain(graph, id) ?? [];
    chain.forEach((node, depth) => {
      const inner = chain.slice(depth + 1).map((n) => n.title).join(" › ");
      node.sdflowErrors = [...(node.sdflowErrors ?? []), ...messages.map((m) => (inner ? `${inner}: ${m}` : m))];
      node.has_errors = true;
    });
    for (const message of messages) {
      const item = document.createElement("div");
      item.className = "error";
      item.dataset.node = id;
      item.textContent = `#${id} ${chainTitle(graph, id) ?? ""}: ${message}`;
      if (chain.length) item.onclick = () => subgraphs.reveal(id);
      box.append(item);
    }
  }
  box.hidden = false;
  canvas.setDirty(true, true);
}

function errorText(e) {
  return [e.message, e.details].filter((s) => s && String(s).trim()).join(": ");
}

// ---- the node catalogue ----

let catalogue = [];

function renderCatalogue() {
  const query = $("node-search").value.trim().toLowerCase();
  const list = $("node-list");
  list.replaceChildren();
  let category = null;
  for (const entry of catalogue) {
    const hay = `${entry.type} ${entry.title} ${entry.category}`.toLowerCase();
    if (query && !query.split(/\s+/).every((word) => hay.includes(word))) continue;
    if (entry.category !== category) {
      category = entry.category;
      const head = document.createElement("li");
      head.className = "category";
      head.textContent = category || "other";
      list.append(head);
    }
    const item = document.createElement("li");
    item.className = "node-type";
    item.dataset.type = entry.type;
    item.textContent = entry.title;
    item.title = entry.description || entry.type;
    item.onclick = () => addNode(entry.type);
    list.append(item);
  }
}

/** Whether a node at `pos` with `size` would cover part of an existing node. */
function overlaps(pos, size) {
  const pad = 20;
  const title = LiteGraph.NODE_TITLE_HEIGHT;
  return canvas.graph._nodes.some((n) =>
    pos[0] < n.pos[0] + n.size[0] + pad && n.pos[0] < pos[0] + size[0] + pad &&
    pos[1] - title < n.pos[1] + n.size[1] + pad && n.pos[1] - title < pos[1] + size[1] + pad);
}

/** Adds a node of `type` to the graph on view, in the first free spot right of the view's left third. */
function addNode(type) {
  const node = LiteGraph.createNode(type);
  const [x, y] = canvas.ds.convertCanvasToOffset([60, 80]);
  const pos = [x, y];
  for (let tries = 0; tries < 200 && overlaps(pos, node.size); tries++) {
    pos[0] += 40;
    if (tries % 25 === 24) {
      pos[0] = x;
      pos[1] += 120;
    }
  }
  node.pos = pos;
  canvas.graph.add(node);
  canvas.selectNode(node);
  canvas.setDirty(true, true);
  return node;
}

// ---- files ----

function saveWorkflow() {
  const blob = new Blob([JSON.stringify(graph.serialize(), null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "workflow.json";
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

async function openFile(file) {
  // A workflow opens at its root (litegraph would otherwise keep a definition of the same id open).
  subgraphs.goTo(0);
  try {
    const note = await loadFile(graph, file);
    clearErrors();
    afterLoad();
    setStatus(note || `opened ${file.name}`, note ? "warn" : "");
  } catch (e) {
    setStatus(e.message, "error");
  } finally {
    // Reading a file is asynchronous: scripts (the browser test) wait on this count.
    window.sdflow.filesHandled += 1;
  }
}

$("btn-load").onclick = () => $("file-load").click();
$("file-load").onchange = (e) => {
  const file = e.target.files?.[0];
  if (file) openFile(file);
  e.target.value = "";
};
$("btn-save").onclick = saveWorkflow;
$("btn-clear").onclick = () => {
  subgraphs.goTo(0);
  graph.clear();
  clearErrors();
  showNotice([]);
  fitView();
};
$("btn-group").onclick = () => {
  const selected = [...canvas.selectedItems];
  const group = new LGraphGroup("Group");
  canvas.graph.add(group);
  if (selected.length) group.resizeTo(selected);
  else {
    const [x, y] = viewCentre();
    group.pos = [x - 200, y - 150];
    group.size = [400, 300];
  }
  canvas.setDirty(true, true);
};

// Files dropped anywhere on the page open as workflows (litegraph's own drop handling
// would only add them as nodes of its built-in types).
window.addEventListener("dragover", (e) => e.preventDefault(), true);
window.addEventListener("drop", (e) => {
  e.preventDefault();
  e.stopPropagation();
  const file = e.dataTransfer?.files?.[0];
  if (file) openFile(file);
}, true);

// ---- image upload for LoadImage ----

view.onUpload = (node, widget) => {
  const input = document.createElement("input");
  input.type = "file";
  input.accept = "image/*";
  input.onchange = async () => {
    const file = input.files?.[0];
    if (!file) return;
    try {
      const name = await api.uploadImage(file);
      if (!widget.options.values.includes(name)) widget.options.values.push(name);
      widget.value = name;
      showImage(node, api.viewUrl({ filename: name.split("/").pop(), subfolder: name.includes("/") ? name.slice(0, name.lastIndexOf("/")) : "", type: "input" }));
      setStatus(`uploaded ${name}`);
    } catch (e) {
      setStatus(e.message, "error");
    }
  };
  input.click();
};

// ---- queueing and live progress ----

/**
 * The prompt to POST: the API prompt the graph makes, or, when it holds subgraph
 * instances, the workflow itself, which the server expands as ComfyUI's frontend does
 * (inner nodes become "instance:inner", promoted widget values taken from the instance).
 */
function promptToQueue() {
  const workflow = graph.serialize();
  if (hasInstances(graph)) return { prompt: workflow, workflow, skipped: [] };
  return { ...graphToPrompt(graph), workflow };
}

async function queue() {
  clearErrors();
  const { prompt, workflow, skipped } = promptToQueue();
  if (!Object.keys(prompt).length) {
    setStatus("nothing to run: add some nodes first", "warn");
    return;
  }
  try {
    const reply = await api.queuePrompt(prompt, clientId, workflow);
    if (skipped.length) setStatus(`queued (#${reply.number ?? "?"}), leaving out nodes this server does not have: ${skipped.join(", ")}`, "warn");
    else setStatus(`queued (#${reply.number ?? "?"})`);
    jobs.refresh();
    for (const node of allNodes(graph)) applyControl(node);
    canvas.setDirty(true, false);
  } catch (e) {
    if (e instanceof api.PromptError) {
      const perNode = {};
      for (const [id, entry] of Object.entries(e.nodeErrors)) perNode[id] = (entry.errors ?? []).map(errorText);
      if (!Object.keys(perNode).length) perNode["?"] = [errorText(e.error ?? { message: e.message })];
      showErrors(e.error?.message || "The server refused the prompt", perNode);
      setStatus("prompt refused: see the errors", "error");
    } else setStatus(e.message, "error");
  }
}
$("btn-queue").onclick = queue;
$("btn-interrupt").onclick = () => api.interrupt().catch((e) => setStatus(e.message, "error"));
window.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    queue();
    return;
  }
  const typing = e.target instanceof HTMLElement && e.target.matches("input, textarea, [contenteditable]");
  if (!typing && modeShortcut(canvas, e)) e.preventDefault();
});

/** What the toolbar calls a node by its execution id: its title, inner ones with their instances'. */
function titleOf(id) {
  return chainTitle(graph, id) ?? id;
}

/** Shows an image on the node an execution id names and on the instances holding it. */
function showOnChain(id, url) {
  for (const node of nodeChain(graph, id) ?? []) showImage(node, url);
}

/** Opens the workflow a job ran: the editor's own graph when it sent one, else its prompt. */
function openJob(job) {
  const extra = job.workflow?.extra_data ?? {};
  const saved = extra.extra_pnginfo?.workflow;
  const where = `job ${job.id}`;
  subgraphs.goTo(0);
  try {
    const note = loadWorkflow(graph, saved && Array.isArray(saved.nodes) && saved.nodes.length ? saved : job.workflow?.prompt, where);
    clearErrors();
    afterLoad();
    setStatus(note || `opened the workflow of ${where}`, note ? "warn" : "");
  } catch (e) {
    setStatus(e.message, "error");
  }
}

const jobs = queuePanel($("queue"), { onOpen: openJob, onError: (e) => setStatus(e.message, "error") });

// The canvas is told to redraw, not the root graph: while a subgraph is open, the root
// graph has no canvas attached.
function setRunning(id) {
  view.running = id == null ? null : String(id);
  view.progress = null;
  $("progress").textContent = id == null ? "" : `running ${titleOf(id)}`;
  canvas.setDirty(true, false);
}

const handlers = {
  status(data) {
    const left = data.status?.exec_info?.queue_remaining;
    if (left === undefined) return;
    queueLeft = left;
    showOutcome();
    jobs.refresh();
  },
  execution_start() {
    clearErrors();
    outcome = { text: "running" };
    showOutcome();
    jobs.refresh();
  },
  executing(data) {
    setRunning(data.node ?? null);
  },
  progress(data) {
    view.running = String(data.node);
    view.progress = { node: String(data.node), value: data.value, max: data.max };
    $("progress").textContent = `${titleOf(data.node)} ${data.value}/${data.max}`;
    canvas.setDirty(true, false);
  },
  executed(data) {
    const images = data.output?.images ?? [];
    addToGallery($("gallery"), images);
    // Node previews draw still images (animated WebP's first frame); videos stay in the gallery.
    const still = images.filter((i) => !/\.(mp4|webm|avi)$/i.test(i.filename));
    if (still.length) showOnChain(data.display_node ?? data.node, api.viewUrl(still[still.length - 1]));
  },
  execution_success() {
    setRunning(null);
    outcome = { text: "done" };
    showOutcome();
    jobs.refresh();
  },
  execution_error(data) {
    setRunning(null);
    showErrors("The prompt failed", { [data.node_id]: [`${data.exception_type ?? "error"}: ${data.exception_message ?? ""}`] });
    outcome = { text: "failed: see the errors", kind: "error" };
    showOutcome();
    jobs.refresh();
  },
  execution_interrupted() {
    setRunning(null);
    outcome = { text: "stopped", kind: "warn" };
    showOutcome();
    jobs.refresh();
  },
};

api.connect(clientId, {
  onOpen: () => {
    setStatus("connected");
    jobs.refresh();
  },
  onClose: () => setStatus("disconnected: reconnecting…", "warn"),
  onEvent: (type, data) => handlers[type]?.(data),
  onPreview: (blob, metadata) => {
    // A preview can arrive after `executing` has named the next node; the metadata (sent
    // because connect() announced supports_preview_metadata) says whose it is. Servers
    // without it leave only the running node to go by.
    const id = metadata ? metadata.display_node_id ?? metadata.node_id : view.running;
    window.sdflow.lastPreview = { node: id == null ? null : String(id), from: metadata ? "metadata" : "running node" };
    // One blob URL per node: showImage revokes the one a node showed before.
    for (const node of nodeChain(graph, id) ?? []) showImage(node, URL.createObjectURL(blob));
  },
});

// ---- start ----

// The open workflow outlives a reload, as in ComfyUI.
function remember() {
  try {
    localStorage.setItem(STORAGE_KEY, JSON.stringify(graph.serialize()));
  } catch {
    // storage full or disabled: the workflow just is not kept
  }
}
window.addEventListener("beforeunload", remember);
setInterval(remember, 5000);

async function start() {
  try {
    catalogue = registerAll(await api.objectInfo());
  } catch (e) {
    setStatus(`could not read the node catalogue: ${e.message}`, "error");
    return;
  }
  renderCatalogue();
  $("node-search").oninput = renderCatalogue;
  const saved = localStorage.getItem(STORAGE_KEY);
  try {
    if (saved) {
      loadWorkflow(graph, JSON.parse(saved), "the last session's workflow");
    } else {
      const first = await api.template(DEFAULT_TEMPLATE);
      if (first) {
        loadWorkflow(graph, first, `the default workflow (${DEFAULT_TEMPLATE})`);
        setStatus(`opened the default workflow (${DEFAULT_TEMPLATE})`);
      }
    }
    afterLoad();
  } catch (e) {
    setStatus(e.message, "warn");
  }
  try {
    await restoreGallery($("gallery"));
  } catch (e) {
    setStatus(`could not read the finished jobs: ${e.message}`, "warn");
  }
  document.body.dataset.ready = "true";
}

canvas.startRendering?.();
fitCanvas();
start();

// For the browser console and the browser test.
window.sdflow = { graph, canvas, view, LiteGraph, graphToPrompt: () => graphToPrompt(graph).prompt, promptToQueue, subgraphs, addNode, fitView, filesHandled: 0, lastPreview: null };
