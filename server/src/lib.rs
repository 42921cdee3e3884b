//! sdflow-server: the HTTP/WebSocket server (`sdflow serve`) with ComfyUI's, A1111's,
//! OpenAI's and sd-server's native APIs over the executor.
//!
//! A crate of its own so the engine builds without the web stack. [`start`] binds, spawns
//! the worker thread that runs queued prompts, and serves until
//! [`RunningServer::shutdown`]. See docs/server.md for the endpoints and the security model.
//!
//! - [`comfy`] — `/prompt`, `/queue`, `/history`, `/interrupt`, `/object_info`,
//!   `/system_stats`, `/models`, `/embeddings`
//! - [`files`] — `/upload/image`, `/upload/mask`, `/view`
//! - [`ws`] — `/ws`
//! - [`sdapi`] — `/sdapi/v1/*`, `/v1/*`, `/sdcpp/v1/*`
//! - [`security`] — origin check, bearer token, CORS, path confinement
//! - [`userdata`] — `/users`, `/settings`, `/userdata` (ComfyUI's per-user storage)
//! - [`jobs`] — `/jobs` (the queue and history as ComfyUI's frontend lists them)
//! - [`frontend`] — `--front-end-root` and the routes ComfyUI's frontend reads at start-up
//! - [`logs`] — recent log lines for the frontend's log panel
//! - [`store`] — the queue and history both modes share an interface for
//! - [`scale_out`] — `--queue redis://`: front ends, `sdflow worker`, the S3 output store

pub mod comfy;
pub mod error;
pub mod extract;
pub mod files;
pub mod frontend;
pub mod history;
pub mod jobs;
pub mod logs;
pub mod queue;
pub mod scale_out;
pub mod sdapi;
pub mod security;
pub mod state;
pub mod store;
pub mod userdata;
pub mod ws;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::Router;
use sdflow_executor::{Executor, ExecutorConfig, Registry};

pub use error::ApiError;
pub use state::{AppState, ServerConfig};

use state::Dirs;

/// Every API route, mounted at `/` and again under `/api` (ComfyUI's frontend uses the
/// prefixed form).
fn api_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/prompt", get(comfy::get_prompt).post(comfy::post_prompt))
        .route("/queue", get(comfy::get_queue).post(comfy::post_queue))
        .route(
            "/history",
            get(comfy::get_history).post(comfy::post_history),
        )
        .route("/history/{prompt_id}", get(comfy::get_history_one))
        .route("/interrupt", post(comfy::post_interrupt))
        .route("/object_info", get(comfy::object_info))
        .route("/object_info/{node_class}", get(comfy::object_info_one))
        .route("/system_stats", get(comfy::system_stats))
        .route("/features", get(comfy::features))
        .route("/models", get(comfy::models))
        .route("/models/{folder}", get(comfy::models_in))
        .route("/embeddings", get(comfy::embeddings))
        .route("/upload/image", post(files::upload_image))
        .route("/upload/mask", post(files::upload_mask))
        .route("/view", get(files::view))
        .route("/ws", get(ws::handler))
        .route("/sdapi/v1/txt2img", post(sdapi::txt2img))
        .route("/sdapi/v1/img2img", post(sdapi::img2img))
        .route("/sdapi/v1/samplers", get(sdapi::samplers))
        .route("/sdapi/v1/schedulers", get(sdapi::schedulers))
        .route("/sdapi/v1/sd-models", get(sdapi::sd_models))
        .route("/sdapi/v1/loras", get(sdapi::loras))
        .route("/sdapi/v1/upscalers", get(sdapi::upscalers))
        .route("/sdapi/v1/latent-upscale-modes", get(sdapi::latent_upscale_modes))
        .route("/sdapi/v1/embeddings", get(sdapi::embeddings))
        .route("/sdapi/v1/options", get(sdapi::get_options).post(sdapi::post_options))
        .route("/sdapi/v1/progress", get(sdapi::progress))
        .route("/sdapi/v1/interrupt", post(sdapi::interrupt))
        .route("/sdapi/v1/skip", post(sdapi::interrupt))
        .route("/sdapi/v1/refresh-checkpoints", post(sdapi::refresh))
        .route("/sdapi/v1/refresh-loras", post(sdapi::refresh))
        .route("/sdapi/v1/png-info", post(sdapi::png_info))
        .route("/sdapi/v1/scripts", get(sdapi::scripts))
        .route("/controlnet/version", get(sdapi::controlnet_version))
        .route("/controlnet/model_list", get(sdapi::controlnet_model_list))
        .route("/controlnet/module_list", get(sdapi::controlnet_module_list))
        .route("/v1/images/generations", post(sdapi::generations))
        .route("/v1/images/edits", post(sdapi::edits))
        .route("/v1/models", get(sdapi::models))
        .route("/sdcpp/v1/capabilities", get(sdapi::sdcpp_capabilities))
        .route("/sdcpp/v1/img_gen", post(sdapi::sdcpp_img_gen))
        .route("/sdcpp/v1/vid_gen", post(sdapi::sdcpp_vid_gen))
        .route("/sdcpp/v1/jobs/{id}", get(sdapi::sdcpp_job))
        .route("/sdcpp/v1/jobs/{id}/cancel", post(sdapi::sdcpp_cancel))
        .route("/users", get(userdata::users).post(userdata::create_user))
        .route("/settings", get(userdata::get_settings).post(userdata::post_settings))
        .route("/settings/{id}", get(userdata::get_setting).post(userdata::post_setting))
        .route("/userdata", get(userdata::list))
        .route("/v2/userdata", get(userdata::list_v2))
        .route(
            "/userdata/{file}",
            get(userdata::get_file).post(userdata::post_file).delete(userdata::delete_file),
        )
        .route("/userdata/{file}/move/{dest}", post(userdata::move_file))
        .route("/jobs", get(jobs::list))
        .route("/jobs/cancel", post(jobs::cancel_many))
        .route("/jobs/{id}", get(jobs::get_one))
        .route("/jobs/{id}/cancel", post(jobs::cancel_one))
        .route("/extensions", get(frontend::extensions))
        .route("/i18n", get(frontend::i18n))
        .route("/workflow_templates", get(frontend::workflow_templates))
        .route("/global_subgraphs", get(frontend::global_subgraphs))
        .route("/global_subgraphs/{id}", get(frontend::global_subgraph))
        .route("/experiment/models", get(frontend::model_folders))
        .route("/experiment/models/{folder}", get(frontend::models_in_folder))
}

/// ComfyUI's `/internal/*` routes, which only its frontend uses.
fn internal_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/folder_paths", get(frontend::internal_folder_paths))
        .route("/files/{directory_type}", get(frontend::internal_files))
        .route("/logs", get(frontend::internal_logs))
        .route("/logs/raw", get(frontend::internal_logs_raw))
        .route("/logs/subscribe", patch(frontend::internal_logs_subscribe))
}

/// The whole application: the API, the embedded editor for every other GET, and the
/// guard in front of all of it.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    let app = Router::new()
        .merge(api_routes())
        .nest("/api", api_routes())
        .nest("/internal", internal_routes())
        .route("/templates/index.json", get(frontend::templates_index))
        .route("/templates/{file}", get(frontend::template));
    // ComfyUI's frontend when one is configured, the embedded editor otherwise.
    let app = match state.front_end_root.clone() {
        Some(root) => app.fallback(move |method: Method, uri: Uri| frontend::serve_file(root.clone(), method, uri)),
        None => app.fallback(editor),
    };
    app
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            security::guard,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The browser editor's files, embedded in the binary by the `sdflow-ui` crate.
async fn editor(method: Method, uri: Uri) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return ApiError::NotFound(format!("no endpoint {method} {}", uri.path())).into_response();
    }
    let path = uri.path().trim_start_matches('/');
    match sdflow_ui::asset(path) {
        Some(asset) => {
            let mut response = asset.bytes.into_owned().into_response();
            let h = response.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.mime));
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
        // JSON like every other API error: clients probing routes (A1111's, sd-server's)
        // parse the body.
        None => ApiError::NotFound(format!("no endpoint or file GET /{path}")).into_response(),
    }
}

/// A server that is listening.
pub struct RunningServer {
    addr: SocketAddr,
    state: Arc<AppState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    serve: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Stops accepting connections, cancels the running prompt, drops pending ones and
    /// waits for the worker (finished results are already in the history directory).
    pub async fn shutdown(mut self) -> Result<(), ApiError> {
        self.stop().await
    }

    async fn stop(&mut self) -> Result<(), ApiError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.state.queue.close();
        if let Some(serve) = self.serve.take() {
            // Open WebSockets would hold graceful shutdown forever; give them a moment.
            match tokio::time::timeout(std::time::Duration::from_secs(2), serve).await {
                Ok(Ok(Err(e))) => return Err(ApiError::io("serving", e)),
                Ok(Err(e)) => return Err(ApiError::Internal(e.to_string())),
                _ => {}
            }
        }
        if let Some(worker) = self.worker.take() {
            tokio::task::spawn_blocking(move || worker.join())
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?
                .map_err(|_| ApiError::Internal("the worker thread panicked".into()))?;
        }
        Ok(())
    }
}

impl Drop for RunningServer {
    // Without a shutdown (a test that panicked, say) the worker must still stop.
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.state.queue.close();
    }
}

fn canonical_dir(path: &std::path::Path, what: &str) -> Result<std::path::PathBuf, ApiError> {
    std::fs::create_dir_all(path)
        .map_err(|e| ApiError::io(format!("creating the {what} folder {}", path.display()), e))?;
    path.canonicalize()
        .map_err(|e| ApiError::io(format!("the {what} folder {}", path.display()), e))
}

/// Binds `config.listen:config.port` and starts serving `registry` with `runtime` (whose
/// residency manager `/system_stats` reports and whose model folders the listing
/// endpoints read). Must be called inside a multi-threaded Tokio runtime.
pub async fn start(
    config: ServerConfig,
    registry: Arc<Registry>,
    runtime: Arc<sdflow_nodes::Runtime>,
) -> Result<RunningServer, ApiError> {
    let dirs = Dirs {
        input: canonical_dir(&config.input_dir, "input")?,
        output: canonical_dir(&config.output_dir, "output")?,
        temp: canonical_dir(&config.temp_dir, "temp")?,
        user: std::path::absolute(&config.user_dir)
            .map_err(|e| ApiError::io(format!("the user folder {}", config.user_dir.display()), e))?,
    };
    let (queue, history, frontend) = match &config.queue_url {
        Some(url) => {
            let url = url.clone();
            let (max_queue, max_history) = (config.max_queue, config.max_history);
            let frontend = tokio::task::spawn_blocking(move || scale_out::Frontend::open(&url, max_queue, max_history))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))??;
            let frontend = Arc::new(frontend);
            (store::Queue::Redis(frontend.clone()), store::HistoryStore::Redis(frontend.clone()), Some(frontend))
        }
        None => (
            store::Queue::Local(queue::JobQueue::new(config.max_queue)),
            store::HistoryStore::Local(history::History::open(&config.history_dir, config.max_history)?),
            None,
        ),
    };
    let front_end_root = match &config.front_end_root {
        Some(dir) => Some(Arc::new(frontend::resolve_front_end_root(dir).map_err(ApiError::Internal)?)),
        None => None,
    };
    let objects = match &config.output_store {
        Some(url) if config.queue_url.is_none() => return Err(ApiError::bad(format!("--output-store {url} goes with --queue (outputs of scale-out workers)"))),
        Some(url) => {
            let url = url.clone();
            let store = tokio::task::spawn_blocking(move || scale_out::objects::ObjectStore::open(&url))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?
                .map_err(|e| ApiError::QueueUnavailable(e.to_string()))?;
            Some(Arc::new(store))
        }
        None => None,
    };
    let executor = Arc::new(Executor::new(registry, ExecutorConfig::default()));
    let addr = SocketAddr::new(config.listen, config.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ApiError::io(format!("listening on {addr}"), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ApiError::io("reading the bound address", e))?;
    let sdapi_options = parking_lot::Mutex::new(state::SdapiOptions { checkpoint: config.default_checkpoint.clone(), clip_skip: None });
    let state = Arc::new(AppState {
        queue,
        history,
        hub: ws::Hub::start(),
        dirs,
        executor,
        runtime,
        config,
        started: std::time::Instant::now(),
        live: Default::default(),
        sdapi_options,
        user_lock: Default::default(),
        front_end_root,
        objects,
        sdcpp_jobs: Default::default(),
    });
    logs::forward(state.clone());
    // Prompts run here, or (scale-out) on workers whose events a listener forwards.
    let worker = match frontend {
        Some(frontend) => scale_out::listen(state.clone(), frontend).map_err(|e| ApiError::io("starting the Redis listener", e))?,
        None => {
            let state = state.clone();
            std::thread::Builder::new()
                .name("sdflow-worker".into())
                .spawn(move || {
                    if let (store::Queue::Local(q), store::HistoryStore::Local(h)) = (&state.queue, &state.history) {
                        state::worker(state.clone(), q, h)
                    }
                })
                .map_err(|e| ApiError::io("starting the worker thread", e))?
        }
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(state.clone());
    let serve = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
    });
    Ok(RunningServer {
        addr,
        state,
        shutdown: Some(tx),
        serve: Some(serve),
        worker: Some(worker),
    })
}

/// Runs the server on a runtime of its own until Ctrl-C (the `sdflow serve` entry point,
/// so the CLI needs no async runtime of its own). `on_ready` is told the bound address.
pub fn serve_until_ctrl_c(
    config: ServerConfig,
    registry: Arc<Registry>,
    runtime: Arc<sdflow_nodes::Runtime>,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ApiError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ApiError::io("starting the async runtime", e))?;
    rt.block_on(async move {
        let server = start(config, registry, runtime).await?;
        on_ready(server.addr());
        tokio::signal::ctrl_c()
            .await
            .map_err(|e| ApiError::io("waiting for Ctrl-C", e))?;
        tracing::info!("stopping");
        server.shutdown().await
    })
}
