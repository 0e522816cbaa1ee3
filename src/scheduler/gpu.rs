//! The one place the engine meets CUDA: whether a supported GPU is present, and the loader
//! that opens it on the worker thread, sizes the decode batch to the memory budget (or admits
//! the one asked for), uploads the weights and serves. A binary built without the `cuda`
//! feature has the same functions, which refuse with the reason, so nothing above the
//! scheduler needs a `cfg`.

#[cfg(feature = "cuda")]
pub use with_cuda::{cuda_loader, gpu_present};
#[cfg(not(feature = "cuda"))]
pub use without_cuda::{cuda_loader, gpu_present};

#[cfg(feature = "cuda")]
mod with_cuda {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::super::engines::{BatchLimits, BatchOptions, EngineModel, GpuOptions};
    use crate::audio::CODEC_SAMPLE_RATE;
    use crate::backend::cuda::admission::{MAX_STREAMS_CAP, MemoryPlan, admit, encoder_scratch_bytes};
    use crate::backend::cuda::codec_encode::CudaF32;
    use crate::backend::cuda::memory::WeightArena;
    use crate::backend::cuda::saved::SAVED_PAGE_BYTES;
    use crate::backend::cuda::{Cuda, CudaOptions};
    use crate::engine::cuda_draws::CudaDraws;
    use crate::engine::cuda_frames::CudaFrames;
    use crate::engine::generate::{LoadModelError, ResidentModel};
    use crate::engine::prefix::PrefixCache;
    use crate::model::codec::encode::{CodecEncoder, MAX_REFERENCE_SECONDS};
    use crate::model::file_order::FileOrderOptions;
    use crate::model::load::Checkpoint;
    use crate::model::memory::encoder_weight_bytes;
    use crate::scheduler::codec::CodecThread;
    use crate::scheduler::{Loader, MemoryUse, ModelHost, ModelLoadError};

    /// The CUDA engine: opens the GPU on the worker thread (which then owns its context and
    /// stream), sizes the decode batch to the budget (or admits the one asked for), uploads the
    /// weights and serves. With `--max-batch 1` and the CUDA graph on, the graph step serves.
    pub fn cuda_loader(model_dir: PathBuf, gpu: GpuOptions, max_prompt_rows: usize, limits: BatchLimits) -> Loader {
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
            // One stream's own captured step (`--max-batch 1`); otherwise the decode batch, whose
            // step is captured per list of streams unless --no-cuda-graph.
            let graph = gpu.graph && limits.max_batch == Some(1);
            // The graph step runs a whole prompt at once; the batch runs prompts in chunks.
            let prefill_rows =
                if graph { max_prompt_rows } else { limits.prefill_chunk.min(max_prompt_rows) }.min(gpu.context);
            let free = cuda.budget().cap() - cuda.budget().used();
            // Whole arena pages, as `reserve_saved_states` takes them.
            let voice_cache = (limits.voice_cache_bytes / SAVED_PAGE_BYTES * SAVED_PAGE_BYTES) as u64;
            let max_batch = limits.max_batch.unwrap_or_else(|| {
                MemoryPlan::max_streams_with(&ckpt, gpu.context, prefill_rows, voice_cache, free, MAX_STREAMS_CAP)
                    .max(1)
            });
            let plan = MemoryPlan::for_engine_streams(&ckpt, gpu.context, prefill_rows, max_batch)
                .with_voice_cache(voice_cache);
            let source =
                if gpu.memory_budget.is_some() { "--gpu-memory-budget" } else { "free memory minus the reserve" };
            admit(&plan, free, source).map_err(|e| ModelLoadError::Gpu(e.to_string()))?;
            tracing::info!(
                max_batch,
                context = gpu.context,
                cuda_graphs = gpu.graph,
                one_stream_graph = graph,
                plan = %plan,
                "engine: memory plan"
            );
            host.progress(&format!("uploading weights to {}", cuda.info().name));
            let started = std::time::Instant::now();
            let read =
                FileOrderOptions { mode: gpu.weights_io, readers: gpu.weights_readers, ..FileOrderOptions::default() };
            let (model, stats, encoder_host) = ResidentModel::load_in_file_order(
                &ckpt,
                &cuda,
                read,
                crate::model::load::UPLOAD_REPORT_BYTES,
                &mut |done, total| {
                    host.progress(&crate::scheduler::engines::upload_stage(done, total));
                },
            )?;
            cuda.synchronize();
            crate::scheduler::engines::log_file_order_upload(&ckpt, started.elapsed(), &stats);
            host.progress("building the engine");
            if voice_cache > 0 {
                cuda.reserve_saved_states(voice_cache as usize).map_err(|e| ModelLoadError::Gpu(e.to_string()))?;
            }
            let prefixes = PrefixCache::new(&cuda, voice_cache as usize);
            // The codec's own stream (warmed up after the step's pool, which has the plan first).
            let codec_stream = if limits.codec_thread { fork_codec_stream(&cuda) } else { None };
            let codec = codec_stream.as_ref().map(|fork| {
                CodecThread::new(&model.codec, fork, max_batch)
                    .with_thread_setup(Box::new(move || fork.bind_to_thread().map_err(|e| e.to_string())))
            });
            let budget = cuda.budget();
            let pools: Vec<_> =
                std::iter::once(cuda.pool()).chain(codec_stream.as_ref().map(Cuda::pool)).map(Arc::clone).collect();
            let sealed = pools.clone();
            let memory = Box::new(move || MemoryUse {
                in_use: budget.used() as usize,
                budget: budget.cap() as usize,
                allocations_after_warm_up: pools.iter().map(|p| p.stats().after_seal).sum(),
            });
            // A fault sticks to the context: every later call fails, the first sync reports it.
            let health = Box::new(|| cuda.device().synchronize().map_err(|e| format!("the GPU reports {e}")));
            let frames = if graph {
                host.progress("capturing the frame step as a CUDA graph");
                Some(
                    CudaFrames::for_model(&cuda, &ckpt, &model)
                        .map_err(|e| ModelLoadError::Gpu(e.to_string()))?
                        .with_prefill_chunk(limits.prefill_chunk)
                        .with_prefix_cache(&prefixes),
                )
            } else {
                None
            };
            // The decode batch draws on the GPU, its step captured per list of streams, unless
            // --no-cuda-graph asks for the host loop.
            let draws = if gpu.graph && frames.is_none() {
                Some(
                    CudaDraws::for_model(&cuda, &ckpt, &model, max_batch)
                        .map_err(|e| ModelLoadError::Gpu(e.to_string()))?,
                )
            } else {
                None
            };
            let batch = BatchOptions { max_batch, prefill_chunk: limits.prefill_chunk, context: Some(gpu.context) };
            let engine = EngineModel::new(&cuda, &ckpt, &model, batch, memory)?
                .with_health_check(health)
                .with_prefix_cache(&prefixes);
            let engine = match (&frames, &draws) {
                (Some(frames), _) => engine.with_device_frames(frames),
                (None, Some(draws)) => engine.with_device_draws(draws),
                (None, None) => engine,
            };
            let engine = match &codec {
                Some(codec) => engine.with_codec_thread(codec),
                None => engine,
            };
            host.progress(&format!("warming up {max_batch} streams"));
            let mut warm = engine.warm_up().map_err(|e| ModelLoadError::Gpu(format!("warm-up: {e}")))?;
            cuda.synchronize();
            let engine = match (&codec, &codec_stream) {
                (Some(codec), Some(fork)) => {
                    host.progress("warming up the codec's stream");
                    match warm_codec(codec, fork) {
                        Ok(()) => engine,
                        Err(why) => {
                            tracing::error!(
                                reason = %why,
                                "the codec's own stream did not warm up; the codec runs inside the step \
                                 (lower --max-batch to make room)"
                            );
                            fork.pool().release_free();
                            let engine = engine.without_codec_thread();
                            warm = engine.warm_up().map_err(|e| ModelLoadError::Gpu(format!("warm-up: {e}")))?;
                            cuda.synchronize();
                            engine
                        }
                    }
                }
                _ => engine,
            };
            tracing::info!(
                used_bytes = cuda.budget().used(),
                pool_bytes = cuda.pool().stats().bytes,
                plan_bytes = plan.total(),
                "engine: decode batch warmed up"
            );
            // The encoder after the batch: an encode runs between steps (on this thread), so it
            // reuses the step's activation buffers the pool holds free, and the plan's encoder
            // term only has to cover what they do not.
            // The encoder only where it fits what the batch left: without it the server still
            // speaks, and voice uploads are refused with 503 (the log says how to make room).
            let need = (encoder_weight_bytes(&ckpt) as u64).next_multiple_of(WeightArena::CHUNK as u64)
                + encoder_scratch_bytes(MAX_REFERENCE_SECONDS);
            let left = cuda.budget().cap() - cuda.budget().used();
            let engine = if left >= need {
                host.progress("loading the codec encoder");
                let f32_backend = CudaF32::new(&cuda);
                // Its host image was read beside the weights' stream; only the upload is left.
                let started = std::time::Instant::now();
                let encoder = CodecEncoder::from_host(&ckpt, &f32_backend, encoder_host.map_err(LoadModelError::from)?);
                cuda.synchronize();
                let uploaded = started.elapsed();
                // The longest clip once, so the pool holds what any encode needs.
                let longest = vec![0.0f32; (MAX_REFERENCE_SECONDS * f64::from(CODEC_SAMPLE_RATE)) as usize];
                encoder
                    .encode(&f32_backend, &longest)
                    .map_err(|e| ModelLoadError::Gpu(format!("encoder warm-up: {e}")))?;
                cuda.synchronize();
                tracing::info!(
                    upload_secs = uploaded.as_secs_f64(),
                    warm_up_secs = (started.elapsed() - uploaded).as_secs_f64(),
                    "engine: codec encoder resident"
                );
                engine.with_encoder(Box::new(move |samples: &[f32]| encoder.encode(&f32_backend, samples)))
            } else {
                tracing::error!(
                    left_bytes = left,
                    needed_bytes = need,
                    "voice cloning is off: the codec encoder does not fit the GPU memory the decode batch left; \
                     lower --max-batch (or raise --gpu-memory-budget)"
                );
                engine
            };
            cuda.synchronize();
            // From here on every driver allocation is one serving made (the metric's count).
            sealed.iter().for_each(|pool| pool.seal());
            tracing::info!(
                streams = warm.streams,
                frames = warm.frames,
                pool_bytes = cuda.pool().stats().bytes,
                "engine: warmed up"
            );
            host.serve(&engine);
            Ok(())
        })
    }

    /// A stream and pool of the codec's own (`Cuda::fork_stream`); `None` (logged) where it
    /// cannot be opened: the codec then runs inside the step, as with `--no-codec-thread`.
    fn fork_codec_stream(cuda: &Cuda) -> Option<Cuda> {
        cuda.fork_stream()
            .inspect_err(|e| {
                tracing::error!(error = %e, "the codec's stream could not be opened; the codec runs inside the step");
            })
            .ok()
    }

    /// Warms the codec thread's pool up for the batch's largest rounds (on this thread).
    fn warm_codec(codec: &CodecThread<'_, Cuda>, fork: &Cuda) -> Result<(), String> {
        let warm = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| codec.warm_up()));
        match warm {
            Ok(Ok(())) => fork.device().synchronize().map_err(|e| e.to_string())?,
            Ok(Err(e)) => return Err(e),
            Err(panic) => return Err(crate::backend::panic_message(&*panic)),
        }
        tracing::info!(pool_bytes = fork.pool().stats().bytes, "engine: codec stream warmed up");
        Ok(())
    }

    /// A supported GPU at `ordinal`, or why not.
    pub fn gpu_present(ordinal: usize) -> Result<(), String> {
        crate::backend::cuda::device::probe(ordinal).map(|_| ()).map_err(|e| e.to_string())
    }
}

#[cfg(not(feature = "cuda"))]
mod without_cuda {
    use std::path::PathBuf;

    use super::super::engines::{BatchLimits, GpuOptions};
    use crate::scheduler::{Loader, ModelLoadError};

    const WITHOUT: &str = "this binary was built without the `cuda` feature";

    /// A supported GPU at `ordinal`, or why not: never, in this build.
    pub fn gpu_present(_ordinal: usize) -> Result<(), String> {
        Err(String::from(WITHOUT))
    }

    /// Refuses to load: this build has no CUDA backend.
    pub fn cuda_loader(_dir: PathBuf, _gpu: GpuOptions, _max_prompt_rows: usize, _limits: BatchLimits) -> Loader {
        Box::new(|_| Err(ModelLoadError::Gpu(String::from(WITHOUT))))
    }
}
