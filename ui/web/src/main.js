// The editor: a litegraph canvas fed by the server's node catalogue, with a toolbar, a
// searchable node list, the output gallery, and live progress over the WebSocket.
import "@comfyorg/litegraph/style.css";
import "./style.css";
import { LiteGraph, LGraph, LGraphCanvas, LGraphGroup } from "@comfyorg/litegraph";
import * as api from "./api.js";
import { applyControl, registerAll, showImage, view } from "./nodes.js";
import { graphToPrompt, loadFile, loadWorkflow } from "./workflow.js";

const $ = (id) => document.getElementById(id);
const STORAGE_KEY = "sdflow.workflow";

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

function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.dataset.kind = kind;
}

function fitCanvas() {
  const wrap = $("canvas-wrap");
  canvas.resize(wrap.clientWidth, wrap.clientHeight);
  canvas.setDirty(true, true);
}
new ResizeObserver(fitCanvas).observe($("canvas-wrap"));

/** The graph point at the middle of the visible canvas. */
function viewCentre() {
  return canvas.ds.convertCanvasToOffset([canvasEl.width / 2 / (window.devicePixelRatio || 1), canvasEl.height / 2 / (window.devicePixelRatio || 1)]);
}

// ---- validation and execution errors, shown on their nodes and listed at the side ----

function clearErrors() {
  for (const node of graph._nodes) {
    node.sdflowErrors = null;
    node.has_errors = false;
  }
  const box = $("errors");
  box.hidden = true;
  box.replaceChildren();
  graph.setDirtyCanvas(true, true);
}

function showErrors(title, perNode) {
  const box = $("errors");
  box.replaceChildren();
  const head = document.createElement("h2");
  head.textContent = title;
  box.append(head);
  for (const [id, messages] of Object.entries(perNode)) {
    const node = graph.getNodeById(Number(id)) ?? graph.getNodeById(id);
    if (node) {
      node.sdflowErrors = messages;
      node.has_errors = true;
    }
    for (const message of messages) {
      const item = document.createElement("div");
      item.className = "error";
      item.dataset.node = id;
      item.textContent = `#${id} ${node?.title ?? ""}: ${message}`;
      if (node) item.onclick = () => canvas.centerOnNode(node);
      box.append(item);
    }
  }
  box.hidden = false;
  graph.setDirtyCanvas(true, true);
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
  return graph._nodes.some((n) =>
    pos[0] < n.pos[0] + n.size[0] + pad && n.pos[0] < pos[0] + size[0] + pad &&
    pos[1] - title < n.pos[1] + n.size[1] + pad && n.pos[1] - title < pos[1] + size[1] + pad);
}

/** Adds a node of `type` in the first free spot right of the view's left third. */
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
  graph.add(node);
  canvas.selectNode(node);
  graph.setDirtyCanvas(true, true);
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
  try {
    const note = await loadFile(graph, file);
    clearErrors();
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
  graph.clear();
  clearErrors();
  graph.setDirtyCanvas(true, true);
};
$("btn-group").onclick = () => {
  const selected = [...canvas.selectedItems];
  const group = new LGraphGroup("Group");
  graph.add(group);
  if (selected.length) group.resizeTo(selected);
  else {
    const [x, y] = viewCentre();
    group.pos = [x - 200, y - 150];
    group.size = [400, 300];
  }
  graph.setDirtyCanvas(true, true);
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

async function queue() {
  clearErrors();
  const { prompt, skipped } = graphToPrompt(graph);
  if (!Object.keys(prompt).length) {
    setStatus("nothing to run: add some nodes first", "warn");
    return;
  }
  try {
    const reply = await api.queuePrompt(prompt, clientId, graph.serialize());
    if (skipped.length) setStatus(`queued (#${reply.number ?? "?"}), leaving out nodes this server does not have: ${skipped.join(", ")}`, "warn");
    else setStatus(`queued (#${reply.number ?? "?"})`);
    for (const node of graph._nodes) applyControl(node);
    graph.setDirtyCanvas(true, false);
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
  }
});

function nodeById(id) {
  return id == null ? null : graph.getNodeById(Number(id)) ?? graph.getNodeById(id);
}

function addToGallery(image) {
  const figure = document.createElement("figure");
  figure.dataset.filename = image.filename;
  const link = document.createElement("a");
  link.href = api.viewUrl(image);
  link.target = "_blank";
  const img = document.createElement("img");
  img.src = link.href;
  img.alt = image.filename;
  link.append(img);
  const caption = document.createElement("figcaption");
  caption.textContent = image.filename;
  figure.append(link, caption);
  $("gallery").prepend(figure);
}

function setRunning(id) {
  view.running = id == null ? null : String(id);
  view.progress = null;
  $("progress").textContent = id == null ? "" : `running ${nodeById(id)?.title ?? id}`;
  graph.setDirtyCanvas(true, false);
}

const handlers = {
  status(data) {
    const left = data.status?.exec_info?.queue_remaining;
    if (left !== undefined) setStatus(`queue: ${left}`);
  },
  execution_start() {
    clearErrors();
  },
  executing(data) {
    setRunning(data.node ?? null);
  },
  progress(data) {
    view.running = String(data.node);
    view.progress = { node: String(data.node), value: data.value, max: data.max };
    $("progress").textContent = `${nodeById(data.node)?.title ?? data.node} ${data.value}/${data.max}`;
    graph.setDirtyCanvas(true, false);
  },
  executed(data) {
    const images = data.output?.images ?? [];
    const node = nodeById(data.node);
    for (const image of images) addToGallery(image);
    if (node && images.length) showImage(node, api.viewUrl(images[images.length - 1]));
  },
  execution_success() {
    setRunning(null);
    setStatus("done");
  },
  execution_error(data) {
    setRunning(null);
    showErrors("The prompt failed", { [data.node_id]: [`${data.exception_type ?? "error"}: ${data.exception_message ?? ""}`] });
    setStatus("the prompt failed: see the errors", "error");
  },
  execution_interrupted() {
    setRunning(null);
    setStatus("stopped", "warn");
  },
};

api.connect(clientId, {
  onOpen: () => setStatus("connected"),
  onClose: () => setStatus("disconnected: reconnecting…", "warn"),
  onEvent: (type, data) => handlers[type]?.(data),
  onPreview: (blob) => {
    const node = nodeById(view.running);
    if (node) showImage(node, URL.createObjectURL(blob));
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
  if (saved) {
    try {
      loadWorkflow(graph, JSON.parse(saved), "the last session's workflow");
    } catch (e) {
      setStatus(e.message, "warn");
    }
  }
  document.body.dataset.ready = "true";
}

canvas.startRendering?.();
fitCanvas();
start();

// For the browser console and the browser test.
window.sdflow = { graph, canvas, view, LiteGraph, graphToPrompt: () => graphToPrompt(graph).prompt, addNode, filesHandled: 0 };
