// Multi-line STRING inputs (`multiline: true` in /object_info, such as prompts) as a
// <textarea> laid over the node, as ComfyUI's frontend shows them: litegraph's own text
// widget edits one line at a time in a popup.
//
// The widget takes the node's free height (litegraph's growable widgets), draws only a
// frame on the canvas, and its element is moved over that frame after every canvas draw.

const MIN_HEIGHT = 60;
const MARGIN = 10;

let layer = null;
const mounted = new Set();

/** The element the textareas live in: it covers the canvas and lets clicks through. */
export function mountLayer(parent) {
  layer = document.createElement("div");
  layer.id = "dom-widgets";
  parent.append(layer);
}

function textareaFor(name, value) {
  const el = document.createElement("textarea");
  el.className = "node-textarea";
  el.value = value ?? "";
  el.placeholder = name;
  el.spellcheck = false;
  el.hidden = true;
  el.dataset.widget = name;
  layer?.append(el);
  return el;
}

/** Adds a textarea widget named `name` holding `value` to `node`. */
export function addTextarea(node, name, value) {
  const el = textareaFor(name, value);
  const widget = {
    type: "customtext",
    name,
    options: { multiline: true },
    y: 0,
    element: el,
    node,
    get value() {
      return el.value;
    },
    set value(v) {
      el.value = v == null ? "" : String(v);
    },
    computeLayoutSize(holder) {
      // A node showing an image (a subgraph instance's preview) keeps its free height for it.
      return { minHeight: MIN_HEIGHT, maxHeight: holder?.sdflowImage ? MIN_HEIGHT : 1e6, minWidth: 0 };
    },
    draw(ctx, node, width, y) {
      // The frame under the element; all that shows where the element is hidden.
      const h = (this.computedHeight ?? MIN_HEIGHT) - 4;
      ctx.fillStyle = "#1e1e1e";
      ctx.strokeStyle = "#555";
      ctx.beginPath();
      ctx.roundRect(MARGIN, y, width - 2 * MARGIN, h, 4);
      ctx.fill();
      ctx.stroke();
    },
    onRemove() {
      el.remove();
      mounted.delete(widget);
    },
  };
  mounted.add(widget);
  return widget;
}

/**
 * Gives a subgraph instance's copy of a textarea widget (a promoted prompt) a textarea of
 * its own: litegraph's copy keeps the inner node's element, which is placed over the inner
 * node, and its value is a snapshot that nothing could edit.
 */
export function adoptTextarea(widget) {
  const el = textareaFor(widget.name, widget.value);
  Object.defineProperty(widget, "value", {
    configurable: true,
    enumerable: true,
    get: () => el.value,
    set: (v) => {
      el.value = v == null ? "" : String(v);
    },
  });
  widget.element = el;
  widget.onRemove = () => {
    el.remove();
    mounted.delete(widget);
  };
  mounted.add(widget);
}

/** Whether `node` still belongs to the open workflow (a definition replaced by a load does not). */
function attached(node) {
  const graph = node.graph;
  if (!graph) return false;
  return graph.isRootGraph !== false || graph.rootGraph?.subgraphs.get(graph.id) === graph;
}

/**
 * Moves every textarea over its widget for the canvas's current view; hides those whose
 * node is collapsed, gone or scrolled out, and dims those fed by a link.
 */
export function placeTextareas(canvas) {
  const { scale, offset } = canvas.ds;
  const order = new Map(canvas.graph?._nodes.map((n, i) => [n, i]) ?? []);
  for (const widget of mounted) {
    const { node, element: el } = widget;
    // A node dropped without onRemoved (graph swapped wholesale, a definition replaced),
    // or a widget its node let go of (an instance promotes its widgets anew on configure).
    const gone = !attached(node) || !node.widgets?.includes(widget);
    if (gone || node.graph !== canvas.graph) {
      if (gone) widget.onRemove();
      else el.hidden = true;
      continue;
    }
    el.dataset.node = String(node.id);
    const visible = !node.collapsed && node.isWidgetVisible(widget) && widget.computedHeight != null;
    el.hidden = !visible;
    if (!visible) continue;
    const x = (node.pos[0] + MARGIN + offset[0]) * scale;
    const y = (node.pos[1] + widget.y + offset[1]) * scale;
    el.style.transform = `translate(${x}px, ${y}px) scale(${scale})`;
    el.style.width = `${node.size[0] - 2 * MARGIN}px`;
    el.style.height = `${widget.computedHeight - 4}px`;
    el.style.zIndex = String(order.get(node) ?? 0);
    const linked = node.getSlotFromWidget?.(widget)?.link != null;
    el.disabled = linked;
    el.classList.toggle("linked", linked);
  }
}
