//! The command line's arguments: every subcommand and its flags (clap).

use super::*;

#[derive(Parser)]
#[command(
    name = "metrale-pack",
    version,
    about = "Repack LLM checkpoints offline into the layouts GPU kernels read, so engines start with one DMA."
)]
pub(crate) struct Cli {
    /// Print no progress, summary or table: errors and warnings only (and what --json asks).
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Show a checkpoint's format, metadata, tensors and dense FFN layers.
    Inspect {
        /// A .gguf file (any shard of a split model), a .safetensors file, an index.json, or a directory.
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Convert a checkpoint (GGUF, safetensors file or directory) into a pack: one GGUF v3 file
    /// with every tensor that is not an FFN weight copied byte for byte, and for each dense FFN
    /// layer the chosen layouts. Every tensor the engine uploads lies in one contiguous device
    /// segment in layer order (all but those --host-tensors names).
    ///
    /// Default layouts: what keeps the source's format (block FP8: fp8; FP8 per channel or
    /// tensor: w8a8; NVFP4: the NVFP4 set; GGUF K-quant, IQ, MXFP4 and NVFP4 mixes: ggml;
    /// `metrale-pack layouts` lists what each keeps); for float sources nvfp4,nvfp4_mmq (SiLU)
    /// or nvfp4,nvfp4_t (GELU). A set that would quantize already-quantized weights again
    /// stops before writing unless --allow-requantize.
    Convert {
        /// The checkpoint: a GGUF file, a safetensors file, or a folder of safetensors shards.
        src: PathBuf,
        /// Output pack (default: SRC with extension .mpk.gguf).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The options every surface takes (`options::CONVERT`: a flag each).
        #[command(flatten)]
        options: convert::Options,
        /// Show each chosen layout's size and error (measured on the first FFN layer), what the
        /// set serves and the disk it needs; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the summary, fidelity and warnings as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Check a pack: every tensor's checksum; with --source, re-derive every tensor from the
    /// source checkpoint and compare bit for bit.
    Verify {
        /// The pack.
        pack: PathBuf,
        /// The checkpoint it was converted from: every tensor re-derived and compared.
        #[arg(long)]
        source: Option<PathBuf>,
        /// Print every check's result as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Check every GPU kernel and layer arm against the host reference on the first CUDA device
    /// (prints a table; exits 1 on any failure; without a GPU says SKIPPED and exits 77).
    GpuCheck {
        /// Only the SmolLM2 shape and small row counts.
        #[arg(long)]
        quick: bool,
        /// Also convert this checkpoint (e.g. the real SmolLM2 GGUF; repeatable) whole, load the
        /// pack by every I/O mode and check it.
        #[arg(long)]
        load_source: Vec<PathBuf>,
        /// Only these sections (comma-separated: kernels, layers, load); default all. With
        /// compute-sanitizer, one section or arm group per run keeps each run short.
        #[arg(long, value_delimiter = ',')]
        sections: Option<Vec<String>>,
        /// Only the layer arms and kernel groups whose name contains one of these
        /// (comma-separated, e.g. `bf16,fp8 fused`; the kernel groups are rules, fp8,
        /// fp8_w8a8, w8a8, bf16, nvfp4, q2g128, affine, q4k_mmq and ggml).
        #[arg(long, value_delimiter = ',')]
        arms: Option<Vec<String>>,
    },
    /// GPU benchmarks: decode bandwidth and prefill TFLOP/s per arm, against the copy ceiling.
    BenchGpu,
    /// Generate a llama-shaped GGUF of random weights (benchmarks, GPU runs): FFN layers, or with
    /// --whole also attention, an output head and a real-sized vocabulary.
    #[command(hide = true)]
    GenModel {
        /// The GGUF to write.
        out: PathBuf,
        /// Hidden size.
        hidden: usize,
        /// Intermediate (FFN) size.
        inter: usize,
        /// FFN layers.
        layers: usize,
        /// F32, F16, BF16, Q8_0, Q4_0, Q4_1 or Q4_K.
        #[arg(value_name = "TYPE")]
        ty: String,
        /// llama (SiLU) or gemma (GELU).
        #[arg(default_value = "llama")]
        arch: String,
        /// Add attention (q, k, v, output and its norm per layer) and the output head.
        #[arg(long)]
        whole: bool,
        /// Vocabulary size of a whole model.
        #[arg(long, default_value_t = 128256)]
        vocab: usize,
        /// Rows of attn_k and attn_v of a whole model (KV heads x head size).
        #[arg(long, default_value_t = 1024)]
        kv_dim: usize,
        /// Head size of a whole model (heads = hidden / head size, KV heads = kv-dim / head size).
        #[arg(long, default_value_t = 128)]
        head_dim: usize,
    },
    /// Seconds to ready: load a pack's device segment and install its overlays on the GPU, warm
    /// and cold, against the pinned host-to-device ceiling measured in the same run; with
    /// --source, the start-up an engine without packs pays (read, build the overlays, upload).
    BenchLoad {
        /// The pack to load.
        pack: PathBuf,
        /// Its checkpoint, for the start-up without packs.
        #[arg(long)]
        source: Option<PathBuf>,
        /// auto, register, staged, hybrid or pageable.
        #[arg(long, default_value = "auto")]
        io: String,
        /// Also time other loader settings (staging ring sizes and reader counts, pieced
        /// registration on several threads), warm, and print each.
        #[arg(long)]
        sweep: bool,
        /// First measure where the time goes: each rate a copy path is built from, alone.
        #[arg(long)]
        probe: bool,
        /// Print the runs as one JSON object on stdout (each run's line goes to stderr); without
        /// a GPU, `{"skipped": reason}` and exit 77.
        #[arg(long)]
        json: bool,
        /// Sleep this many milliseconds before each timed load (a load after idle, against
        /// loads back to back).
        #[arg(long, default_value_t = 0)]
        pause_ms: u64,
        /// Read the staging ring's first chunks whole, as later ones (default: growing from
        /// chunk / readers, so the first copy starts sooner).
        #[arg(long)]
        no_ramp: bool,
        /// Build the forward context (and load the kernel modules) after the copy instead of
        /// beside it.
        #[arg(long)]
        side_after: bool,
    },
    /// Every arm of the recorded layers, loaded from PACK, on real activations (INPUTS/layerN.npy:
    /// f32 [tokens, hidden] FFN inputs, e.g. from `scripts/quality_kl.py --record`) against the
    /// float64 FFN of SOURCE's weights, beside the same arm on random activations of the same
    /// row norms (needs a GPU; without one says SKIPPED and exits 77).
    CheckActivations {
        /// The pack.
        pack: PathBuf,
        /// The checkpoint it was converted from (the float64 reference's weights).
        #[arg(long)]
        source: PathBuf,
        /// The recorded FFN inputs (a folder of per-layer .npy files).
        #[arg(long)]
        inputs: PathBuf,
        /// Comma-separated layers (default: every recorded one).
        #[arg(long, value_delimiter = ',')]
        layers: Vec<usize>,
        /// At most this many rows per layer.
        #[arg(long, default_value_t = 512)]
        max_rows: usize,
    },
    /// The tensor-parallel layer: convert SOURCE with --tp 1 and --tp N, then run every arm of
    /// one layer at each m on N GPUs (rank r on GPU r, partial outputs summed by NCCL), against
    /// the float64 FFN and the one-GPU pack's arm; per-call times with the all-reduce on its own.
    TpCheck {
        /// The checkpoint to convert at --tp N and at --tp 1.
        source: PathBuf,
        /// Ranks (one GPU each).
        #[arg(long)]
        tp: u32,
        /// Comma-separated layouts (default: the model's defaults).
        #[arg(long, value_delimiter = ',')]
        layouts: Option<Vec<String>>,
        /// The FFN layer checked.
        #[arg(long, default_value_t = 0)]
        layer: usize,
        /// Rows per call.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,8,16,64,512")]
        ms: Vec<usize>,
        /// Timed calls per row (median); 0: no timing.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Where the two packs are written (default: a folder under the temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// N host backends summed on the host instead of GPUs and NCCL.
        #[arg(long)]
        host: bool,
        /// A PEFT adapter (adds the lora layout and the arm "nvfp4 + lora").
        #[arg(long)]
        lora: Option<PathBuf>,
    },
    /// Seconds to ready of each rank of TP_PACK, every rank loading at once on its own GPU,
    /// against ONE_PACK (the same model at --tp 1) on GPU 0 and the pinned ceiling measured on
    /// every GPU at once.
    BenchLoadTp {
        /// The tensor-parallel pack.
        tp_pack: PathBuf,
        /// The same model converted at --tp 1.
        one_pack: PathBuf,
        /// Comma-separated copy modes the ranks load with, each timed in turn: auto, register,
        /// staged, pageable, or hybrid:F (the registered share F of each rank's bytes).
        #[arg(long, value_delimiter = ',', default_value = "auto")]
        modes: Vec<String>,
    },
    /// Layer LAYER's FFN from PACK by one arm (as check-activations names it) on the rows of INPUT
    /// (f32 [rows, hidden] .npy), written to OUTPUT (.npy): for a model run that takes the arm's
    /// outputs in place of its FFN (`scripts/quality_kl.py --arms`). Runs on the first GPU, or on
    /// the host backend without one.
    #[command(hide = true)]
    FfnApply {
        /// The pack.
        pack: PathBuf,
        /// The FFN layer.
        #[arg(long)]
        layer: usize,
        /// The arm, as check-activations names it.
        #[arg(long)]
        arm: String,
        /// The input rows: f32 [rows, hidden] .npy.
        input: PathBuf,
        /// The output .npy to write.
        output: PathBuf,
    },
    /// Write a pack's device tensors as U8 tensors of one safetensors file: the same bytes, for the
    /// peers of bench-load (`scripts/peer_loaders.py`).
    #[command(hide = true)]
    ExportSegment {
        /// The pack.
        pack: PathBuf,
        /// The safetensors file to write.
        out: PathBuf,
    },
    /// Every layout a pack can hold: bits per weight, the forward kinds it serves, what it
    /// needs beside it, its error on a generated layer (measured now) and which source formats
    /// it keeps as they are.
    Layouts,
    /// Print a completion script for SHELL on stdout (e.g. `metrale-pack completions bash >
    /// ~/.local/share/bash-completion/completions/metrale-pack`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write one tensor to a .npy file: decoded to f32 in its logical shape, or its stored bytes.
    Dump {
        /// A checkpoint (GGUF or safetensors) or a pack.
        file: PathBuf,
        /// Tensor name. For a quantized FFN weight (ModelOpt/compressed-tensors NVFP4, FP8) name
        /// its main tensor (`...weight` / `...weight_packed`): the scales are applied.
        tensor: String,
        /// Output .npy path.
        #[arg(short, long)]
        output: PathBuf,
        /// Write the stored bytes as a 1-D u8 array instead of decoding.
        #[arg(long)]
        raw: bool,
    },
}
