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

const PREVIEW_IMAGE = 1;
const FORMATS = { 1: "image/jpeg", 2: "image/png" };

/**
 * Keeps a WebSocket to /ws open (reconnecting after a drop) and hands each JSON event to
 * `onEvent(type, data)` and each binary preview frame to `onPreview(blob)`.
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
      onOpen?.();
    };
    ws.onmessage = (msg) => {
      if (msg.data instanceof ArrayBuffer) {
        if (msg.data.byteLength < 8) return;
        const view = new DataView(msg.data);
        if (view.getUint32(0) !== PREVIEW_IMAGE) return;
        const mime = FORMATS[view.getUint32(4)];
        if (mime) onPreview(new Blob([msg.data.slice(8)], { type: mime }));
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
