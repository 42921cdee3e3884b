// The right-click menus, holding what ComfyUI's hold. litegraph brings Add Node, Add Group,
// Title, Mode, Pin, Colors, Shapes, Clone and Remove; ComfyUI adds Bypass, converting a
// widget to an input (so a link can feed it) and back, and opening a node's image.
import { LGraphEventMode, LGraphGroup } from "@comfyorg/litegraph";

// The editor opens and runs the subgraphs that workflows bring; making one (litegraph's
// conversion, which clones nodes and promotes their widgets) is left out until the browser
// test covers it with this editor's widgets (prompt text boxes, seed controls).
const UNSUPPORTED = new Set(["Convert to Subgraph 🆕"]);

function supported(options) {
  return options.filter((o) => !o || !UNSUPPORTED.has(o.content));
}

/** The node and, when it is one of them, the other selected nodes. */
function targets(canvas, node) {
  const selected = Object.values(canvas.selected_nodes ?? {});
  return selected.includes(node) ? selected : [node];
}

function toggleBypass(canvas, node) {
  const nodes = targets(canvas, node);
  // One click sets them all alike, as ComfyUI's Ctrl+B does.
  const mode = node.mode === LGraphEventMode.BYPASS ? LGraphEventMode.ALWAYS : LGraphEventMode.BYPASS;
  for (const n of nodes) n.mode = mode;
  canvas.setDirty(true, true);
}

/** Gives widget `w` an input slot, so a link can feed it in place of its value. */
export function convertToInput(node, w) {
  node.addInput(w.name, w.sdflowType, { widget: { name: w.name } });
  const [width, height] = node.computeSize();
  node.setSize([Math.max(node.size[0], width), Math.max(node.size[1], height)]);
  node.setDirtyCanvas(true, true);
}

/** Takes the input slot of a widget away again (only while nothing is linked to it). */
export function convertToWidget(node, input) {
  const slot = node.inputs.indexOf(input);
  if (slot >= 0 && input.link == null) node.removeInput(slot);
  node.setDirtyCanvas(true, true);
}

// Opens a subgraph instance for the menu; set by the app, which keeps the breadcrumb.
let openInstance = null;

export function setOpenInstance(open) {
  openInstance = open;
}

/** `getExtraMenuOptions` of every node type: the entries litegraph lacks. */
export function nodeMenu(canvas) {
  const node = this;
  const extra = [];
  if (node.isSubgraphNode?.() && openInstance) {
    extra.push({ content: "Open Subgraph", callback: () => openInstance(node) });
  }
  extra.push(
    {
      content: node.mode === LGraphEventMode.BYPASS ? "Remove Bypass" : "Bypass",
      callback: () => toggleBypass(canvas, node),
    },
  );
  const convertible = (node.widgets ?? []).filter((w) => w.sdflowType && !node.getSlotFromWidget(w));
  if (convertible.length) {
    extra.push({
      content: "Convert Widget to Input",
      has_submenu: true,
      submenu: {
        title: "Widget",
        options: convertible.map((w) => ({ content: `Convert ${w.name} to input`, callback: () => convertToInput(node, w) })),
      },
    });
  }
  const converted = (node.inputs ?? []).filter((i) => i.widget && i.link == null && node.widgets?.some((w) => w.name === i.widget.name && w.sdflowType));
  if (converted.length) {
    extra.push({
      content: "Convert Input to Widget",
      has_submenu: true,
      submenu: {
        title: "Input",
        options: converted.map((i) => ({ content: `Convert ${i.name} to widget`, callback: () => convertToWidget(node, i) })),
      },
    });
  }
  if (node.sdflowImage?.src) {
    extra.push({ content: "Open Image", callback: () => window.open(node.sdflowImage.src, "_blank") });
  }
  return extra;
}

/** Wires the canvas menu (and the node menu's ending) to what this editor can run. */
export function installMenus(canvas, graph) {
  const base = canvas.getCanvasMenuOptions.bind(canvas);
  canvas.getCanvasMenuOptions = () => {
    const options = supported(base());
    const selected = Object.values(canvas.selected_nodes ?? {});
    if (selected.length) {
      options.push(null, {
        content: "Add Group For Selected Nodes",
        callback: () => {
          const group = new LGraphGroup("Group");
          canvas.graph.add(group);
          group.resizeTo(selected);
          canvas.setDirty(true, true);
        },
      }, {
        content: selected[0].mode === LGraphEventMode.BYPASS ? "Remove Bypass of Selected" : "Bypass Selected",
        callback: () => toggleBypass(canvas, selected[0]),
      });
    }
    return options;
  };
  const filter = (options) => {
    const kept = supported(options);
    options.splice(0, options.length, ...kept);
  };
  // litegraph asks the graph holding the node, which inside a subgraph is its definition.
  graph.onGetNodeMenuOptions = filter;
  graph.events.addEventListener("subgraph-created", (e) => {
    e.detail.subgraph.onGetNodeMenuOptions = filter;
  });
}

/** ComfyUI's keys: Ctrl+B bypasses the selected nodes, Ctrl+M mutes them. */
export function modeShortcut(canvas, e) {
  if (!(e.ctrlKey || e.metaKey) || e.altKey) return false;
  const key = e.key.toLowerCase();
  if (key !== "b" && key !== "m") return false;
  const selected = Object.values(canvas.selected_nodes ?? {});
  if (!selected.length) return false;
  const mode = key === "b" ? LGraphEventMode.BYPASS : LGraphEventMode.NEVER;
  const to = selected.every((n) => n.mode === mode) ? LGraphEventMode.ALWAYS : mode;
  for (const n of selected) n.mode = to;
  canvas.setDirty(true, true);
  return true;
}
