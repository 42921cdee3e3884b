// The queue and history panel and the Outputs gallery, both read from the server's jobs
// API (ComfyUI's /api/jobs), so they are there again after a reload.
import * as api from "./api.js";

const LIST_LIMIT = 30;
// Finished jobs whose images fill the gallery after a reload.
const GALLERY_JOBS = 20;
const STATUS_WORDS = { pending: "pending", in_progress: "running", completed: "done", failed: "failed", cancelled: "stopped" };

const shown = new Set();
const VIDEO_FILE = /\.(mp4|webm)$/i;

function imageKey(image) {
  return `${image.type ?? "output"}/${image.subfolder ?? ""}/${image.filename}`;
}

/** Puts images at the top of the gallery, newest first; ones already there are skipped. */
export function addToGallery(gallery, images) {
  for (const image of images) {
    const key = imageKey(image);
    if (shown.has(key)) continue;
    shown.add(key);
    const figure = document.createElement("figure");
    figure.dataset.filename = image.filename;
    const link = document.createElement("a");
    link.href = api.viewUrl(image);
    link.target = "_blank";
    // Videos (SaveVideo's MP4, sd-cli's WebM) play in place; animated WebP plays as an image.
    const video = VIDEO_FILE.test(image.filename);
    const media = document.createElement(video ? "video" : "img");
    media.src = link.href;
    if (video) Object.assign(media, { controls: true, loop: true, muted: true, autoplay: true, playsInline: true });
    else Object.assign(media, { alt: image.filename, loading: "lazy" });
    link.append(media);
    const caption = document.createElement("figcaption");
    caption.textContent = image.filename;
    figure.append(link, caption);
    gallery.prepend(figure);
  }
}

/** The images of a job's outputs, node by node. */
function imagesOf(outputs) {
  return Object.values(outputs ?? {}).flatMap((o) => (Array.isArray(o?.images) ? o.images : []));
}

/** Fills the gallery from the latest finished jobs (what a reload would otherwise lose). */
export async function restoreGallery(gallery) {
  const { jobs } = await api.listJobs({ status: "completed,failed,cancelled", limit: GALLERY_JOBS });
  const details = await Promise.all(
    jobs.filter((j) => j.outputs_count > 0).map((j) => api.getJob(j.id).catch(() => null)),
  );
  // Oldest first, each prepended: the newest ends on top, as live results do.
  for (const job of details.filter(Boolean).reverse()) addToGallery(gallery, imagesOf(job.outputs));
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function jobTimes(job) {
  const parts = [];
  if (job.create_time) parts.push(clock(job.create_time));
  if (job.execution_start_time && job.execution_end_time) {
    parts.push(`${((job.execution_end_time - job.execution_start_time) / 1000).toFixed(1)} s`);
  }
  return parts.join(" · ");
}

/**
 * The panel: one row per job (state, times, thumbnail of its first output), with Cancel on
 * queued and running jobs and Open on finished ones. `refresh()` re-reads the list.
 */
export function queuePanel(list, { onOpen, onError }) {
  let pending = null;
  let again = false;

  function row(job) {
    const item = document.createElement("li");
    item.className = "job";
    item.dataset.id = job.id;
    item.dataset.status = job.status;
    const preview = job.preview_output;
    if (preview?.filename && (preview.mediaType ?? "images") === "images") {
      const img = document.createElement("img");
      img.className = "thumb";
      img.src = api.viewUrl(preview);
      img.alt = preview.filename;
      item.append(img);
    } else {
      const empty = document.createElement("div");
      empty.className = "thumb";
      item.append(empty);
    }
    const info = document.createElement("div");
    info.className = "info";
    const state = document.createElement("span");
    state.className = "state";
    state.textContent = STATUS_WORDS[job.status] ?? job.status;
    const times = document.createElement("span");
    times.className = "times";
    times.textContent = jobTimes(job);
    info.append(state, times);
    if (job.execution_error?.exception_message) info.title = job.execution_error.exception_message;
    item.append(info);
    const button = document.createElement("button");
    if (job.status === "pending" || job.status === "in_progress") {
      button.className = "cancel";
      button.textContent = "Cancel";
      button.title = job.status === "pending" ? "Take it off the queue" : "Stop it";
      button.onclick = async () => {
        button.disabled = true;
        try {
          await api.cancelJob(job.id);
        } catch (e) {
          onError(e);
        }
        refresh();
      };
    } else {
      button.className = "open";
      button.textContent = "Open";
      button.title = "Open the workflow this job ran";
      button.onclick = async () => {
        try {
          onOpen(await api.getJob(job.id));
        } catch (e) {
          onError(e);
        }
      };
    }
    item.append(button);
    return item;
  }

  async function load() {
    const { jobs } = await api.listJobs({ limit: LIST_LIMIT });
    // Queued jobs first (in their order), then the finished ones, newest first.
    const queued = jobs.filter((j) => j.status === "in_progress" || j.status === "pending");
    queued.sort((a, b) => (a.status === "in_progress" ? -1 : b.status === "in_progress" ? 1 : (a.priority ?? 0) - (b.priority ?? 0)));
    const done = jobs.filter((j) => !queued.includes(j));
    list.replaceChildren(...[...queued, ...done].map(row));
  }

  /** Re-reads the list; calls made while one runs are folded into one more read. */
  function refresh() {
    if (pending) {
      again = true;
      return pending;
    }
    pending = load()
      .catch(onError)
      .finally(() => {
        pending = null;
        if (again) {
          again = false;
          refresh();
        }
      });
    return pending;
  }

  return { refresh };
}
