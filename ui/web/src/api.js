// The ComfyUI HTTP and WebSocket API as sdflow serves it, relative to the page's origin.

/** A POST /prompt that the server refused, with ComfyUI's `error` and `node_errors`. */
export class PromptError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `the server answered HTTP ${status}`);
    this.status = status;
    this.error = body?.error ?? null;
    this.nodeErrors = body?.node_errors ?? {};
  }
}

async function json(response, what) {
  if (!response.ok) {
    let detail = "";
    try {
      detail = (await response.text()).slice(0, 300);
    } catch {
      // the status line alone still says what went wrong
    }
    throw new Error(`${what}: HTTP ${response.status}${detail ? ` — ${detail}` : ""}`);
  }
  return response.json();
}

export async function objectInfo() {
  return json(await fetch("object_info"), "GET /object_info");
}

export async function queuePrompt(prompt, clientId, workflow) {
  const response = await fetch("prompt", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, client_id: clientId, extra_data: { extra_pnginfo: { workflow } } }),
  });
  let body = null;
  try {
    body = await response.json();
  } catch {
    // a non-JSON refusal keeps only its status
  }
  if (!response.ok) throw new PromptError(response.status, body);
  return body;
}

export async function interrupt() {
  await json(await fetch("interrupt", { method: "POST" }), "POST /interrupt");
}

/** Uploads an image into the input folder; resolves to the name LoadImage takes. */
export async function uploadImage(file) {
  const form = new FormData();
  form.append("image", file, file.name);
  form.append("type", "input");
  const reply = await json(await fetch("upload/image", { method: "POST", body: form }), "POST /upload/image");
  return reply.subfolder ? `${reply.subfolder}/${reply.name}` : reply.name;
}

export function viewUrl(image) {
  const q = new URLSearchParams({ filename: image.filename, subfolder: image.subfolder ?? "", type: image.type ?? "output" });
  return `view?${q}`;
}

/** One of sdflow's committed workflows in the UI format, or null when there is none. */
export async function template(name) {
  const response = await fetch(`templates/${encodeURIComponent(name)}.json`);
  if (response.status === 404) return null;
  return json(response, `GET /templates/${name}.json`);
}

/** ComfyUI's jobs API: the queue and the history, newest first. */
export async function listJobs({ status, limit } = {}) {
  const q = new URLSearchParams();
  if (status) q.set("status", status);
  if (limit) q.set("limit", String(limit));
  return json(await fetch(`api/jobs?${q}`), "GET /api/jobs");
}

/** A job with its `outputs` and `workflow` ({prompt, extra_data}). */
export async function getJob(id) {
  return json(await fetch(`api/jobs/${encodeURIComponent(id)}`), `GET /api/jobs/${id}`);
}

/** Takes a pending job off the queue or interrupts the running one. */
export async function cancelJob(id) {
  return json(await fetch(`api/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" }), `POST /api/jobs/${id}/cancel`);
}

const PREVIEW_IMAGE = 1;
const PREVIEW_IMAGE_WITH_METADATA = 4;
const FORMATS = { 1: "image/jpeg", 2: "image/png" };

/** The preview in a binary frame: `{ blob, metadata }` (metadata only in type-4 frames), or null. */
export function parsePreview(buffer) {
  if (buffer.byteLength < 8) return null;
  const view = new DataView(buffer);
  const type = view.getUint32(0);
  if (type === PREVIEW_IMAGE) {
    const mime = FORMATS[view.getUint32(4)];
    return mime ? { blob: new Blob([buffer.slice(8)], { type: mime }), metadata: null } : null;
  }
  if (type === PREVIEW_IMAGE_WITH_METADATA) {
    const length = view.getUint32(4);
    if (8 + length > buffer.byteLength) return null;
    let metadata;
    try {
      metadata = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, length)));
    } catch {
      return null;
    }
    return { blob: new Blob([buffer.slice(8 + length)], { type: metadata?.image_type || "image/jpeg" }), metadata };
  }
  return null;
}

/**
 * Keeps a WebSocket to /ws open (reconnecting after a drop) and hands each JSON event to
 * `onEvent(type, data)` and each binary preview to `onPreview(blob, metadata)`; metadata
 * names the node that made the preview (null from servers that do not send it).
 */
export function connect(clientId, { onEvent, onPreview, onOpen, onClose }) {
  let delay = 500;
  const open = () => {
    const url = new URL(`ws?clientId=${encodeURIComponent(clientId)}`, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      delay = 500;
      // Must be the first message: ComfyUI's server reads the client's flags only then.
      // With them, previews come with the node that made them.
      ws.send(JSON.stringify({ type: "feature_flags", data: { supports_preview_metadata: true } }));
      onOpen?.();
    };
    ws.onmessage = (msg) => {
      if (msg.data instanceof ArrayBuffer) {
        const preview = parsePreview(msg.data);
        if (preview) onPreview(preview.blob, preview.metadata);
        return;
      }
      let event;
      try {
        event = JSON.parse(msg.data);
      } catch {
        console.warn("sdflow: a WebSocket message that is not JSON was ignored");
        return;
      }
      if (event && typeof event.type === "string") onEvent(event.type, event.data ?? {});
    };
    ws.onclose = () => {
      onClose?.();
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10_000);
    };
  };
  open();
}
