// Subgraphs (ComfyUI's `definitions.subgraphs`). litegraph 0.17 brings the definitions
// (Subgraph), the instance node (SubgraphNode, its inputs and promoted widgets) and the
// canvas's openSubgraph, but it creates nodes only of registered types: ComfyUI's frontend
// registers one type per definition as it is created, and so does this. It also keeps the
// chain of instances the canvas has been opened through (the breadcrumb), which is what
// maps the execution ids the server reports for inner nodes ("11:5": node 5 inside
// instance 11) to the nodes on view.
import { LiteGraph, SubgraphNode } from "@comfyorg/litegraph";
import { adoptTextarea } from "./textarea.js";
import { view } from "./nodes.js";

/** Every node of the workflow: the root's, then each subgraph definition's. */
export function allNodes(root) {
  return [...root._nodes, ...[...root.subgraphs.values()].flatMap((s) => s._nodes)];
}

/** Whether the root graph holds a subgraph instance (queueing then needs the server's expansion). */
export function hasInstances(root) {
  return root._nodes.some((n) => n.isSubgraphNode?.());
}

/**
 * The nodes an execution id passes through, outermost first: `["11:5"]` gives instance 11
 * of the root and node 5 of its definition. Null when any of them is not in the graph.
 */
export function nodeChain(root, id) {
  if (id == null) return null;
  const chain = [];
  let graph = root;
  for (const part of String(id).split(":")) {
    const node = graph?.getNodeById(Number(part)) ?? graph?.getNodeById(part);
    if (!node) return null;
    chain.push(node);
    graph = node.isSubgraphNode?.() ? node.subgraph : null;
  }
  return chain;
}

/** The titles along an execution id, for messages: `Sample › KSampler`. */
export function chainTitle(root, id) {
  const chain = nodeChain(root, id);
  return chain ? chain.map((n) => n.title).join(" › ") : null;
}

/** Registers the node type of one definition, as ComfyUI's frontend does on `subgraph-created`. */
function register(subgraph, decorate) {
  // What SubgraphNode's constructor configures from; the slots come from the definition.
  const blank = { id: -1, type: subgraph.id, pos: [0, 0], size: [100, 100], inputs: [], outputs: [], flags: {}, order: 0, mode: 0 };
  class Instance extends SubgraphNode {
    static title = subgraph.name;
    // Definitions are opened with workflows, not picked from litegraph's Add Node menu.
    static skip_list = true;
    constructor() {
      super(subgraph.rootGraph, subgraph, blank);
      // litegraph's open button is an icon font glyph ComfyUI's page loads and this one does not.
      for (const b of this.title_buttons ?? []) if (b.name === "enter_subgraph") b.text = "⤢";
      // The server reads promoted widget values from the instance's widgets_values.
      this.serialize_widgets = true;
    }
    onRemoved() {
      super.onRemoved();
      for (const w of this.widgets ?? []) w.onRemove?.();
    }
  }
  decorate(Instance);
  LiteGraph.registerNodeType(subgraph.id, Instance);
}

/**
 * Wires subgraph support into the editor: node types for definitions, prompts promoted to
 * an instance shown as textareas, the breadcrumb in `crumbs`, and `onEnter(graph, ds)`
 * after every change of the graph on the canvas (`ds`: the view to restore, or null to fit
 * one). Returns the navigation functions.
 */
export function installSubgraphs(root, canvas, { crumbs, decorate, onEnter }) {
  // Instances opened from the root down: { node, graph: the graph holding it, ds: its view }.
  const opened = [];
  const registered = new Set();

  // A type left from an earlier workflow would make an instance of a definition no longer
  // in the graph, for a file that names the id without defining it.
  root.events.addEventListener("configuring", () => {
    for (const id of registered) LiteGraph.unregisterNodeType(id);
    registered.clear();
  });
  root.events.addEventListener("subgraph-created", (e) => {
    const { subgraph } = e.detail;
    register(subgraph, decorate);
    registered.add(subgraph.id);
    subgraph.events.addEventListener("widget-promoted", (p) => {
      // The copy litegraph makes of a textarea widget would share the inner node's element.
      if (p.detail.widget.type === "customtext") adoptTextarea(p.detail.widget);
    });
  });

  function render() {
    view.path = opened.map((o) => String(o.node.id));
    crumbs.replaceChildren();
    crumbs.hidden = !opened.length;
    const levels = [{ title: "Root", depth: 0 }, ...opened.map((o, i) => ({ title: o.node.title || o.node.subgraph.name, depth: i + 1 }))];
    levels.forEach(({ title, depth }, i) => {
      if (i) crumbs.append(Object.assign(document.createElement("span"), { className: "sep", textContent: "›" }));
      const here = depth === opened.length;
      const crumb = Object.assign(document.createElement(here ? "span" : "button"), { className: "crumb", textContent: title });
      crumb.dataset.depth = String(depth);
      if (!here) crumb.onclick = () => goTo(depth);
      crumbs.append(crumb);
    });
  }

  function open(node) {
    opened.push({ node, graph: canvas.graph, ds: { scale: canvas.ds.scale, offset: [...canvas.ds.offset] } });
    base(node.subgraph);
    render();
    onEnter(canvas.graph, null);
  }

  // litegraph opens a definition (double-click, the instance's title button) without
  // saying which instance: the selected or hovered one of the graph on view.
  const base = canvas.openSubgraph.bind(canvas);
  canvas.openSubgraph = (subgraph) => {
    const candidates = canvas.graph._nodes.filter((n) => n.subgraph === subgraph);
    const node = candidates.find((n) => canvas.selected_nodes?.[n.id]) ?? candidates.find((n) => n === canvas.node_over) ?? candidates[0];
    if (node) open(node);
  };

  /** Back to the graph `depth` instances down from the root (0: the root), with its old view. */
  function goTo(depth) {
    if (depth >= opened.length) return;
    const { graph, ds } = opened[depth];
    opened.length = depth;
    canvas.setGraph(graph);
    render();
    onEnter(graph, ds);
  }

  /** Shows the node with execution id `id`, opening the instances that hold it. */
  function reveal(id) {
    const chain = nodeChain(root, id);
    if (!chain) return;
    const holders = chain.slice(0, -1);
    const same = opened.length === holders.length && holders.every((n, i) => opened[i].node === n);
    if (!same) {
      goTo(0);
      for (const n of holders) open(n);
    }
    canvas.centerOnNode(chain[chain.length - 1]);
  }

  render();
  return { open, goTo, reveal };
}
