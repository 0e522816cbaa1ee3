//! The engines the worker can load, each as a [`Loader`]: checkpoint → resident weights → engine,
//! then [`ModelHost::serve`]. Both run the same generation code (`engine::generate`) over their
//! backend; the CUDA loader also opens the GPU on the worker thread and admits the model against
//! the memory budget before uploading anything.

use std::path::PathBuf;

use super::{Loader, MemoryUse, ModelHost, SynthError, Synthesizer};
use crate::backend::Backend;
use crate::backend::cpu::Cpu;
use crate::engine::generate::{AudioSink, Engine, Finished, GenerateError, GenerateOptions, ResidentModel};
use crate::inspect::device_budget;
use crate::model::frame::Rows;
use crate::model::load::Checkpoint;
use crate::request::prompt::PromptBuilder;

/// Rows budgeted for a prompt on top of `max_frames` when sizing the CPU engine's memory report.
const PROMPT_ROWS_ALLOWANCE: usize = 4096;

/// How the CUDA engine is opened (`serve --gpu-memory-budget`, `--context-length`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuOptions {
    pub ordinal: usize,
    /// Hard cap on device memory; `None`: free memory at start minus a reserve.
    pub memory_budget: Option<u64>,
    /// Positions (prompt rows + frames) each request's caches hold.
    pub context: usize,
    /// Each frame as one captured CUDA graph (`false`: the host-driven loop, `--no-cuda-graph`).
    pub graph: bool,
}

/// The CPU reference engine: checkpoint → resident weights → engine, then serve.
pub fn cpu_loader(model_dir: PathBuf, max_frames: usize) -> Loader {
    Box::new(move |host: &mut dyn ModelHost| {
        host.progress(&format!("opening checkpoint {}", model_dir.display()));
        let ckpt = Checkpoint::open(&model_dir)?;
        host.progress("loading weights");
        let model = ResidentModel::load(&ckpt, &Cpu)?;
        host.progress("building the engine");
        let budget = device_budget(&ckpt, max_frames + PROMPT_ROWS_ALLOWANCE);
        let memory = MemoryUse { in_use: budget.model_weights + budget.codec_weights, budget: budget.total(1) };
        let engine = EngineModel::new(&Cpu, &ckpt, &model, None, Box::new(move || memory))?;
        host.serve(&engine);
        Ok(())
    })
}

/// A loaded engine on backend `B` as the worker's [`Synthesizer`].
pub struct EngineModel<'w, B: Backend> {
    engine: Engine<'w, B>,
    prompt: PromptBuilder<'w>,
    samples_per_frame: usize,
    /// Positions a request's caches hold, where they are fixed (the GPU's); `None`: unbounded.
    context: Option<usize>,
    memory: Box<dyn Fn() -> MemoryUse + 'w>,
    health: Option<Box<dyn Fn() -> Result<(), String> + 'w>>,
}

impl<'w, B: Backend> EngineModel<'w, B> {
    pub fn new(
        backend: &'w B,
        ckpt: &'w Checkpoint,
        model: &'w ResidentModel<B>,
        context: Option<usize>,
        memory: Box<dyn Fn() -> MemoryUse + 'w>,
    ) -> Result<Self, crate::engine::generate::LoadModelError> {
        Ok(EngineModel {
            engine: Engine::new(backend, ckpt, model)?,
            prompt: PromptBuilder::for_checkpoint(ckpt),
            samples_per_frame: ckpt.codec_dims.samples_per_frame(),
            context,
            memory,
            health: None,
        })
    }

    /// Produces frames with a backend's device-side step (see [`Engine::set_device_frames`]).
    pub fn with_device_frames(mut self, device: Box<dyn crate::engine::generate::DeviceFrames + 'w>) -> Self {
        self.engine.set_device_frames(device);
        self
    }

    /// Asks `check` whether the engine still works after a failed job (see
    /// [`Synthesizer::health`]).
    pub fn with_health_check(mut self, check: Box<dyn Fn() -> Result<(), String> + 'w>) -> Self {
        self.health = Some(check);
        self
    }
}

impl<B: Backend> Synthesizer for EngineModel<'_, B> {
    fn sample_rate(&self) -> u32 {
        crate::audio::CODEC_SAMPLE_RATE
    }

    fn samples_per_frame(&self) -> usize {
        self.samples_per_frame
    }

    fn memory(&self) -> MemoryUse {
        (self.memory)()
    }

    fn prompt(&self, text: &str) -> Result<Rows, SynthError> {
        Ok(self.prompt.build(text, &[])?)
    }

    fn health(&self) -> Result<(), String> {
        self.health.as_ref().map_or(Ok(()), |check| check())
    }

    fn generate(
        &self,
        rows: &Rows,
        options: &GenerateOptions,
        sink: &mut dyn AudioSink,
    ) -> Result<Finished, SynthError> {
        let mut options = options.clone();
        if let Some(context) = self.context {
            // As the reference: frames stop where the context ends ("length"), and a prompt
            // that leaves no room for one frame is refused.
            if rows.len() >= context {
                return Err(GenerateError::ContextFull { prompt_rows: rows.len(), context }.into());
            }
            options.max_frames = options.max_frames.min(context - rows.len());
        }
        Ok(self.engine.generate(rows, &options, sink)?)
    }
}

#[cfg(feature = "cuda")]
pub use gpu::cuda_loader;

#[cfg(feature = "cuda")]
mod gpu {
    use std::path::PathBuf;

    use super::{EngineModel, GpuOptions};
    use crate::backend::cuda::admission::{MemoryPlan, admit};
    use crate::backend::cuda::{Cuda, CudaOptions};
    use crate::engine::cuda_frames::CudaFrames;
    use crate::engine::generate::ResidentModel;
    use crate::model::load::Checkpoint;
    use crate::scheduler::{Loader, MemoryUse, ModelHost, ModelLoadError};

    /// The CUDA engine: opens the GPU on the worker thread (which then owns its context and
    /// stream), admits the model against the budget, uploads the weights and serves.
    pub fn cuda_loader(model_dir: PathBuf, gpu: GpuOptions, max_prompt_rows: usize) -> Loader {
        Box::new(move |host: &mut dyn ModelHost| {
            host.progress(&format!("opening GPU {}", gpu.ordinal));
            let options = CudaOptions {
                ordinal: gpu.ordinal,
                memory_budget: gpu.memory_budget,
                context: gpu.context,
                ..CudaOptions::default()
            };
            let cuda = Cuda::open(&options).map_err(|e| ModelLoadError::Gpu(e.to_string()))?;
            host.progress(&format!("opening checkpoint {}", model_dir.display()));
            let ckpt = Checkpoint::open(&model_dir)?;
            let plan = MemoryPlan::for_engine(&ckpt, gpu.context, max_prompt_rows.min(gpu.context));
            let source =
                if gpu.memory_budget.is_some() { "--gpu-memory-budget" } else { "free memory minus the reserve" };
            admit(&plan, cuda.budget().cap() - cuda.budget().used(), source)
                .map_err(|e| ModelLoadError::Gpu(e.to_string()))?;
            host.progress(&format!("uploading weights to {}", cuda.info().name));
            let model = ResidentModel::load(&ckpt, &cuda)?;
            cuda.synchronize();
            host.progress("building the engine");
            let budget = cuda.budget();
            let memory = Box::new(move || MemoryUse { in_use: budget.used() as usize, budget: budget.cap() as usize });
            // A fault sticks to the context: every later call fails, the first sync reports it.
            let health = Box::new(|| cuda.device().synchronize().map_err(|e| format!("the GPU reports {e}")));
            let mut engine =
                EngineModel::new(&cuda, &ckpt, &model, Some(gpu.context), memory)?.with_health_check(health);
            if gpu.graph {
                host.progress("capturing the frame step as a CUDA graph");
                let frames =
                    CudaFrames::for_model(&cuda, &ckpt, &model).map_err(|e| ModelLoadError::Gpu(e.to_string()))?;
                engine = engine.with_device_frames(Box::new(frames));
            }
            host.serve(&engine);
            Ok(())
        })
    }
}
