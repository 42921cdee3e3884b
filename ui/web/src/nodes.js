// Turns ComfyUI's `/object_info` catalogue into litegraph node types: one input slot per
// linked input, one widget per widget input, one output slot per output.
import { LiteGraph, LGraphEventMode, LGraphNode, RenderShape } from "@comfyorg/litegraph";
import { nodeMenu } from "./menu.js";
import { addTextarea } from "./textarea.js";

export const CONTROL_VALUES = ["fixed", "increment", "decrement", "randomize"];
const WIDGET_TYPES = new Set(["INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"]);
// litegraph warns about widgets without a callback; the value itself is what is read
const noop = () => {};

/** Per-node state the editor draws on top of litegraph's own rendering. */
export const view = {
  running: null, // execution id of the node being executed ("11:5": node 5 inside subgraph instance 11)
  progress: null, // { node, value, max }
  path: [], // ids of the subgraph instances opened from the root down to the graph on the canvas
  onUpload: null, // (node, widget) => void, set by the app
};

/**
 * The id, in the graph on the canvas, of the node that stands for execution id `id`: the
 * node itself, or the instance that holds it; null when it lies outside the graph on view.
 */
export function shownId(id) {
  if (id == null) return null;
  const parts = String(id).split(":");
  const depth = view.path.length;
  if (parts.length <= depth || view.path.some((p, i) => parts[i] !== p)) return null;
  return parts[depth];
}

/** The decimals a FLOAT widget shows: as many as its step has. */
function decimals(step) {
  const text = String(step);
  if (text.includes("e-")) return Number(text.split("e-")[1]);
  const dot = text.indexOf(".");
  return dot < 0 ? 0 : text.length - dot - 1;
}

/** `[TYPE, opts]` or `[[choices], opts]` → { type, options, choices }. */
export function parseSpec(spec) {
  const [head, options = {}] = Array.isArray(spec) ? spec : [spec];
  if (Array.isArray(head)) return { type: "COMBO", options, choices: head.map(String) };
  if (head === "COMBO") return { type: "COMBO", options, choices: (options.options ?? []).map(String) };
  return { type: String(head), options, choices: null };
}

function isWidget(parsed) {
  return WIDGET_TYPES.has(parsed.type) && !parsed.options.forceInput;
}

function addWidgetFor(node, name, parsed) {
  const w = makeWidget(node, name, parsed);
  // The slot type a widget converted to an input takes (ComfyUI's: COMBO for lists).
  if (w) w.sdflowType = parsed.type;
  return w;
}

function makeWidget(node, name, parsed) {
  const o = parsed.options;
  switch (parsed.type) {
    case "INT": {
      const step = o.step ?? 1;
      // `this`, not the widget made here: a subgraph instance promotes a copy of it.
      const w = node.addWidget("number", name, o.default ?? o.min ?? 0, function (v) {
        this.value = Math.round(v);
      }, { min: o.min, max: o.max, step: step * 10, step2: step, precision: 0, round: 1 });
      if (o.control_after_generate) {
        const c = node.addWidget("combo", "control_after_generate", "randomize", noop, { values: CONTROL_VALUES });
        c.sdflowControl = w;
      }
      return w;
    }
    case "FLOAT": {
      const step = o.step ?? 0.01;
      const precision = o.precision ?? Math.min(decimals(step), 6);
      return node.addWidget("number", name, o.default ?? o.min ?? 0, noop, {
        min: o.min, max: o.max, step: step * 10, step2: step, precision, round: o.round ?? step,
      });
    }
    case "STRING":
      if (o.multiline) return node.addCustomWidget(addTextarea(node, name, o.default ?? ""));
      return node.addWidget("text", name, o.default ?? "", noop, { multiline: false });
    case "BOOLEAN":
      return node.addWidget("toggle", name, !!o.default, noop, { on: o.label_on ?? "true", off: o.label_off ?? "false" });
    case "COMBO": {
      const values = parsed.choices;
      // Picking a value is the answer to a "not on this server" mark, on the widget picked
      // from (`this`: a subgraph instance's promoted copy is another widget than `w`).
      const w = node.addWidget("combo", name, o.default ?? values[0] ?? "", function () {
        clearMissing(this);
      }, { values });
      if (o.image_upload) {
        // ComfyUI's upload button carries the value "image": workflows keep it in widgets_values.
        const b = node.addWidget("button", "upload", "image", () => view.onUpload?.(node, w));
        b.label = "choose file to upload";
        b.serialize = true;
        b.sdflowSkip = true;
      }
      return w;
    }
  }
  return null;
}

function clearMissing(w) {
  if (w.sdflowMissing === undefined) return;
  delete w.sdflowMissing;
  w.label = undefined;
}

/**
 * List values (model files, images, samplers) a loaded workflow names that are not among
 * the node's choices here: each widget is marked and switched to the first choice there is,
 * so the graph runs. Returns one line per change, for the notice.
 */
export function fitChoices(nodes) {
  const notes = [];
  for (const node of nodes) {
    for (const w of node.widgets ?? []) {
      if (w.type !== "combo" || w.sdflowControl || !Array.isArray(w.options?.values)) continue;
      const values = w.options.values;
      // A widget fed by a link: its own value is not what runs.
      if (values.includes(w.value) || node.getSlotFromWidget?.(w)?.link != null) continue;
      const missing = w.value;
      w.sdflowMissing = missing;
      node.setDirtyCanvas(true, true);
      w.label = `⚠ ${w.name}`;
      // Inner nodes of a subgraph are named with it: their ids repeat across definitions.
      const inner = node.graph?.isRootGraph === false ? `${node.graph.name} › ` : "";
      const where = `${inner}${node.title} #${node.id}: ${w.name} "${missing}" is not on this server`;
      if (values.length) {
        w.value = values[0];
        notes.push(`${where}; switched to "${values[0]}" (present: ${shortList(values)})`);
      } else notes.push(`${where}, and none is: add one to the server's folder`);
    }
  }
  return notes;
}

function shortList(values, max = 5) {
  const shown = values.slice(0, max).join(", ");
  return values.length > max ? `${shown} and ${values.length - max} more` : shown;
}

/** The next value of a seed-like widget after a queue, by its control widget. */
export function applyControl(node) {
  for (const c of node.widgets ?? []) {
    const w = c.sdflowControl;
    if (!w) continue;
    const { min = 0, max = Number.MAX_SAFE_INTEGER, step2 = 1 } = w.options;
    const span = Math.min(max, Number.MAX_SAFE_INTEGER) - min;
    if (c.value === "increment") w.value = Math.min(max, w.value + step2);
    else if (c.value === "decrement") w.value = Math.max(min, w.value - step2);
    else if (c.value === "randomize") w.value = min + Math.floor(Math.random() * (span + 1));
  }
}

function wrapText(ctx, text, width) {
  const lines = [];
  for (const para of String(text).split("\n")) {
    let line = "";
    for (const word of para.split(" ")) {
      const next = line ? `${line} ${word}` : word;
      if (line && ctx.measureText(next).width > width) {
        lines.push(line);
        line = word;
      } else line = next;
    }
    lines.push(line);
  }
  return lines;
}

function drawOverlay(ctx) {
  const [w, h] = this.size;
  const title = LiteGraph.NODE_TITLE_HEIGHT;
  // litegraph draws bypassed and muted nodes like the others; ComfyUI tints them
  if (this.mode === LGraphEventMode.BYPASS || this.mode === LGraphEventMode.NEVER) {
    ctx.fillStyle = this.mode === LGraphEventMode.BYPASS ? "rgba(160, 60, 200, 0.35)" : "rgba(20, 20, 20, 0.55)";
    ctx.fillRect(0, -title, w, h + title);
  }
  for (const widget of this.widgets ?? []) {
    if (widget.sdflowMissing === undefined) continue;
    // Widgets are laid out after this runs: the first frame has no place for the mark yet.
    if (widget.last_y == null) {
      this.setDirtyCanvas(true, false);
      continue;
    }
    ctx.strokeStyle = "#ffb74d";
    ctx.lineWidth = 2;
    ctx.strokeRect(12, widget.last_y - 1, w - 24, LiteGraph.NODE_WIDGET_HEIGHT + 2);
  }
  if (this.sdflowImage?.complete && this.sdflowImage.naturalWidth) {
    const img = this.sdflowImage;
    const top = this.sdflowImageTop ?? 0;
    const room = [w - 10, h - top - 5];
    if (room[1] > 10) {
      const scale = Math.min(room[0] / img.naturalWidth, room[1] / img.naturalHeight);
      const [iw, ih] = [img.naturalWidth * scale, img.naturalHeight * scale];
      ctx.drawImage(img, (w - iw) / 2, top + (room[1] - ih) / 2, iw, ih);
    }
  }
  if (shownId(view.running) === String(this.id)) {
    ctx.strokeStyle = "#4caf50";
    ctx.lineWidth = 3;
    ctx.strokeRect(-2, -title - 2, w + 4, h + title + 4);
    const p = view.progress;
    if (p && shownId(p.node) === String(this.id) && p.max > 0) {
      ctx.fillStyle = "#4caf50";
      ctx.fillRect(0, -title, (w * p.value) / p.max, 3);
      ctx.font = "12px sans-serif";
      ctx.textAlign = "right";
      ctx.fillText(`${p.value}/${p.max}`, w - 6, -title - 6);
      ctx.textAlign = "left";
    }
  }
  // litegraph outlines a node with has_errors itself; the messages go below it
  if (this.sdflowErrors?.length) {
    ctx.font = "12px sans-serif";
    ctx.fillStyle = "#ff8a80";
    let y = h + 16;
    for (const message of this.sdflowErrors) {
      for (const line of wrapText(ctx, message, Math.max(w, 200))) {
        ctx.fillText(line, 0, y);
        y += 15;
      }
    }
  }
}

/** Shows `url` inside the node, growing it to make room the first time. */
export function showImage(node, url) {
  const img = new Image();
  img.onload = () => node.setDirtyCanvas(true, false);
  img.src = url;
  if (node.sdflowImage?.src?.startsWith("blob:") && node.sdflowImage.src !== url) URL.revokeObjectURL(node.sdflowImage.src);
  node.sdflowImage = img;
  const base = node.computeSize();
  node.sdflowImageTop = base[1];
  if (node.size[1] < base[1] + 180) node.setSize([Math.max(node.size[0], 220), base[1] + 200]);
}

/** What every node type of this editor draws over litegraph's node and adds to its menu. */
export function decorate(cls) {
  cls.prototype.onDrawForeground = drawOverlay;
  cls.prototype.getExtraMenuOptions = nodeMenu;
}

/** Registers one node type per `/object_info` entry; returns the catalogue, sorted. */
export function registerAll(info) {
  const catalogue = [];
  for (const [type, def] of Object.entries(info)) {
    const required = def.input?.required ?? {};
    const optional = def.input?.optional ?? {};
    const order = [
      ...(def.input_order?.required ?? Object.keys(required)).map((n) => [n, required[n], false]),
      ...(def.input_order?.optional ?? Object.keys(optional)).map((n) => [n, optional[n], true]),
    ].filter(([, spec]) => spec !== undefined);
    const outputs = def.output ?? [];
    class ComfyNode extends LGraphNode {
      static title = def.display_name || type;
      static comfyClass = type;
      constructor(title) {
        super(title);
        this.serialize_widgets = true;
        for (const [name, spec, opt] of order) {
          const parsed = parseSpec(spec);
          if (isWidget(parsed)) addWidgetFor(this, name, parsed);
          else this.addInput(name, parsed.type, opt ? { shape: RenderShape.HollowCircle } : undefined);
        }
        outputs.forEach((t, i) => {
          this.addOutput(def.output_name?.[i] || t, t, def.output_is_list?.[i] ? { shape: RenderShape.GRID } : undefined);
        });
        this.setSize(this.computeSize());
        if (this.size[0] < 220) this.size[0] = 220;
      }
    }
    decorate(ComfyNode);
    ComfyNode.prototype.onRemoved = function () {
      for (const w of this.widgets ?? []) w.onRemove?.();
    };
    LiteGraph.registerNodeType(type, ComfyNode);
    ComfyNode.category = def.category ?? "";
    catalogue.push({ type, title: ComfyNode.title, category: ComfyNode.category, description: def.description ?? "" });
  }
  catalogue.sort((a, b) => a.category.localeCompare(b.category) || a.title.localeCompare(b.title));
  return catalogue;
}
