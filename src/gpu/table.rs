//! The kernel table: one description per kernel of `kernels/*.cu` (module, entry point,
//! parameters by name and kind, grid rule, row cap, activation rounding). The layer's launches
//! build their arguments by name through [`Call`], the host backend reads them by name through
//! [`Args`], and `gpu-check`'s kernel rows take caps and rounding from here; a test checks every
//! description against the `extern "C"` signature parsed from the `.cu` source.

use super::kernels::ParamKind;
use super::reference::ActRound;
use super::{DevicePtr, GpuBackend, GpuError, GpuResult, KArg, KernelHandle, LaunchCfg, StreamId};

/// One axis of a launch grid.
#[derive(Clone, Copy, Debug)]
pub enum Axis {
    /// One block.
    One,
    /// A fixed number of blocks (the dual GEMV's gate and up).
    Fixed(usize),
    /// `ceil(arg / per)` blocks over the named `int` argument.
    Per(&'static str, usize),
    /// Blocks from a rule over the arguments, for products `Per` cannot express.
    Rule(fn(&Args) -> GpuResult<usize>),
}

/// How a launch's grid follows from its arguments: `x` by `y` blocks of `threads` threads.
#[derive(Clone, Copy, Debug)]
pub struct Grid {
    /// Blocks along x.
    pub x: Axis,
    /// Blocks along y.
    pub y: Axis,
    /// Threads per block.
    pub threads: usize,
    /// Dynamic shared memory per block in bytes (0 for kernels with static shared memory only).
    pub smem: usize,
    /// A persistent kernel: its blocks stride over the `x` blocks of work, so the backend
    /// launches at most one block per multiprocessor ([`GpuBackend::multiprocessors`]).
    pub persistent: bool,
}

/// How a tensor-map (`t`) parameter follows from a launch's arguments: the pointer given for
/// `param`, with rows of `row_bytes` (the named `int` argument) times `elem` bytes and `rows`
/// rows, in boxes of `box_rows` x `box_bytes`.
#[derive(Clone, Copy, Debug)]
pub struct TmapRule {
    /// The `t` parameter (given to [`Call::ptr`] as a pointer).
    pub param: &'static str,
    /// The `int` argument holding the elements per row (and row stride).
    pub row_bytes: &'static str,
    /// Bytes per element of a row (1 for the 8-bit operands, 2 for bf16).
    pub elem: usize,
    /// The `int` argument holding the rows.
    pub rows: &'static str,
    /// Rows per box.
    pub box_rows: usize,
    /// Bytes per box row.
    pub box_bytes: usize,
}

/// The description of one kernel.
#[derive(Debug)]
pub struct KernelSpec {
    /// The field of [`Kernels`] that holds it.
    pub field: &'static str,
    /// Its module (`kernels/<module>.cu`).
    pub module: &'static str,
    /// Its `extern "C"` entry point.
    pub name: &'static str,
    /// Its parameters in order, `name:kind` separated by spaces; kind `p` pointer, `i` int,
    /// `f` float. Must equal the parsed `.cu` signature (tested).
    pub params: &'static str,
    /// Its grid.
    pub grid: Grid,
    /// The most rows (its `m` argument) one launch serves; `None`: any.
    pub row_cap: Option<usize>,
    /// How it rounds f32 activations before multiplying (the host twin's contract).
    pub round: ActRound,
    /// Its tensor-map parameters' rules (one per `t` parameter).
    pub tmaps: &'static [TmapRule],
    /// Launched as a programmatic dependent of the launch before it in the stream (it may start
    /// while that one runs): its source calls `pdl_wait()` before it reads anything an earlier
    /// launch wrote or writes anything (kernels/common.cuh; tested against the source).
    pub dependent: bool,
    /// `params` parsed once (every launch looks its arguments up in it).
    parsed: std::sync::OnceLock<Vec<(&'static str, ParamKind)>>,
}

/// The most parameters a kernel may take (the widest, the dual GEMV, takes 14).
pub const MAX_PARAMS: usize = 24;

impl KernelSpec {
    fn parsed(&self) -> &[(&'static str, ParamKind)] {
        self.parsed.get_or_init(|| {
            self.params
                .split_whitespace()
                .map(|p| {
                    let (n, k) = p.split_once(':').unwrap_or((p, "i"));
                    let kind = match k {
                        "p" => ParamKind::Ptr,
                        "f" => ParamKind::Float,
                        "t" => ParamKind::Tmap,
                        _ => ParamKind::Int,
                    };
                    (n, kind)
                })
                .collect()
        })
    }

    /// `(name, kind)` of each parameter, in order.
    pub fn params(&self) -> impl Iterator<Item = (&'static str, ParamKind)> + '_ {
        self.parsed().iter().copied()
    }

    fn position(&self, name: &str) -> Option<(usize, ParamKind)> {
        self.parsed()
            .iter()
            .position(|(n, _)| *n == name)
            .map(|i| (i, self.parsed()[i].1))
    }
}

/// The spec of entry point `name` of `module`.
pub fn spec(module: &str, name: &str) -> Option<&'static KernelSpec> {
    KERNELS
        .iter()
        .find(|s| s.module == module && s.name == name)
}

mod args;
pub use args::Args;
use args::kind_ok;

/// A resolved kernel with its description; a missing one has handle 0.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    /// The backend's handle (0: not available).
    pub handle: KernelHandle,
    /// Its description.
    pub spec: &'static KernelSpec,
}

impl Kernel {
    /// Whether the backend has it.
    pub fn ok(&self) -> bool {
        self.handle.ok()
    }

    /// A launch of it, arguments to be given by name.
    pub fn call(&self) -> Call {
        Call {
            kernel: *self,
            args: [("", KArg::I32(0)); MAX_PARAMS],
            given: 0,
        }
    }

    /// The error of a path that needs it when it is missing.
    pub fn missing(&self) -> GpuError {
        GpuError::MissingKernel {
            module: self.spec.module.into(),
            name: self.spec.name.into(),
        }
    }
}

/// A launch being built: arguments by name, in any order.
pub struct Call {
    kernel: Kernel,
    /// The arguments given, in the order given (no allocation per launch).
    args: [(&'static str, KArg); MAX_PARAMS],
    given: usize,
}

impl Call {
    fn push(mut self, name: &'static str, a: KArg) -> Self {
        // One past the end records that too many were given; `finish` refuses it.
        if self.given < MAX_PARAMS {
            self.args[self.given] = (name, a);
        }
        self.given = self.given.saturating_add(1);
        self
    }

    /// Pointer argument `name`.
    pub fn ptr(self, name: &'static str, p: DevicePtr) -> Self {
        self.push(name, KArg::Ptr(p))
    }

    /// `int` argument `name` (refused at [`finish`](Self::finish) above `i32::MAX`).
    pub fn dim(self, name: &'static str, v: usize) -> Self {
        self.push(name, KArg::Dim(v))
    }

    /// `float` argument `name`.
    pub fn float(self, name: &'static str, v: f32) -> Self {
        self.push(name, KArg::F32(v))
    }

    /// The positional arguments in the signature's order, every parameter given once with its
    /// kind, the row cap kept, and the grid by the table's rule.
    pub fn finish(self) -> GpuResult<Launch> {
        let Kernel { handle, spec } = self.kernel;
        if !handle.ok() {
            return Err(self.kernel.missing());
        }
        let nparams = spec.parsed().len();
        if self.given > MAX_PARAMS || nparams > MAX_PARAMS {
            return Err(GpuError::Invalid(format!(
                "{}: more than {MAX_PARAMS} arguments",
                spec.name
            )));
        }
        let mut slots: [Option<KArg>; MAX_PARAMS] = [None; MAX_PARAMS];
        for &(name, a) in &self.args[..self.given] {
            let (i, kind) = spec.position(name).ok_or_else(|| {
                GpuError::Invalid(format!("{}: no parameter `{name}`", spec.name))
            })?;
            // A `t` parameter is given as its pointer; its rule makes the map below.
            let tmap_ptr = kind == ParamKind::Tmap && matches!(a, KArg::Ptr(_));
            if !(kind_ok(kind, &a) || tmap_ptr) || slots[i].is_some() {
                return Err(GpuError::Invalid(format!(
                    "{}: argument `{name}` = {a:?} given twice or of the wrong kind ({kind:?})",
                    spec.name
                )));
            }
            slots[i] = Some(a);
        }
        let mut args = Vec::with_capacity(nparams);
        for (s, (name, _)) in slots.into_iter().zip(spec.params()) {
            args.push(s.ok_or_else(|| {
                GpuError::Invalid(format!("{}: argument `{name}` not given", spec.name))
            })?);
        }
        // The `t` parameters' maps, read through a view not yet checked (each map's pointer
        // stands in its slot until it is replaced here).
        let raw = Args { spec, a: &args };
        let maps = spec
            .tmaps
            .iter()
            .map(|r| raw.tmap(r))
            .collect::<GpuResult<Vec<_>>>()?;
        for (r, map) in spec.tmaps.iter().zip(maps) {
            let (i, _) = spec.position(r.param).expect("Args::tmap found it");
            args[i] = KArg::Tmap(map);
        }
        let view = Args::new(spec, &args)?;
        view.check_rows()?;
        let cfg = view.launch_cfg()?;
        Ok(Launch {
            handle,
            spec,
            cfg,
            args,
        })
    }
}

/// A launch ready to run.
#[derive(Debug)]
pub struct Launch {
    /// The kernel.
    pub handle: KernelHandle,
    /// Its description.
    pub spec: &'static KernelSpec,
    /// Grid and block by the table's rule.
    pub cfg: LaunchCfg,
    /// Positional arguments.
    pub args: Vec<KArg>,
}

impl Launch {
    /// Run it on `stream` (a persistent kernel on at most one block per multiprocessor).
    pub fn run(&self, b: &dyn GpuBackend, stream: StreamId) -> GpuResult<()> {
        b.launch(
            self.handle,
            self.cfg_on(b.multiprocessors()),
            stream,
            &self.args,
        )
    }

    /// The launch configuration on a device of `sms` multiprocessors: a persistent kernel's
    /// blocks (x) at most one per multiprocessor, any other grid as the table gave it.
    pub fn cfg_on(&self, sms: Option<usize>) -> LaunchCfg {
        let mut cfg = self.cfg;
        if let (true, Some(sms)) = (self.spec.grid.persistent, sms) {
            cfg.grid.0 = cfg
                .grid
                .0
                .min(u32::try_from(sms.max(1)).unwrap_or(u32::MAX));
        }
        cfg
    }
}

/// `ceil(product of the named int arguments / div)`, each product checked.
fn blocks_of(a: &Args, names: &[&str], div: usize) -> GpuResult<usize> {
    let mut v: usize = 1;
    for n in names {
        v = v
            .checked_mul(a.dim(n)?)
            .ok_or_else(|| GpuError::Invalid(format!("grid: product over {names:?} overflows")))?;
    }
    Ok(v.div_ceil(div))
}

use crate::gpu::sizes::{
    AFFINE_GEMV_BLOCK_ROWS, AFFINE_GEMV_KS_BLOCK_ROWS, AFFINE_GEMV_WARPS, BF16_GEMV_ROWS,
    DQ_WGMMA_BM, DQ_WGMMA_BN, DQ_WGMMA_SMEM, DQ_WGMMA_THREADS, FP8_GEMV_ROWS, FP8_MMA_GEMV_ROWS,
    FP8_MMA_GEMV_WARPS, FP8_QUANT_THREADS, GGML_GEMV_MAX_M, GGML_GEMV_ROWS, GGML_GEMV_SPLIT_M,
    GGML_GEMV_SPLIT4_M, GGML_GEMV1_WARPS, INT8_GEMV_M_ROWS, INT8_GEMV_ROWS,
    NVFP4_GEMV_ROWS as COLS, NVFP4_GEMV_WARPS_DUAL, NVFP4_GEMV_WARPS_ONE, Q4K_GEMV_M_ROWS,
    Q4K_GEMV_ROWS, W8A8_WGMMA_BK, W8A8_WGMMA_BM, W8A8_WGMMA_BN, W8A8_WGMMA_SMALL_BM,
    W8A8_WGMMA_SMALL_BN, W8A8_WGMMA_SMALL_SMEM, W8A8_WGMMA_SMEM, W8A8_WGMMA_THREADS,
};
/// Threads per block of the NVFP4 decode GEMVs: one-projection and dual.
const ONE_T: usize = 32 * NVFP4_GEMV_WARPS_ONE;
const DUAL_T: usize = 32 * NVFP4_GEMV_WARPS_DUAL;
use Axis::{Fixed, One, Per, Rule};

/// Columns per block of the per-group FP8 quantizers: 8 warps of one 128-column group each.
const FP8_G128_COLS: usize = 8 * 128;

/// The `bm` x `bn` output tiles over the `m` x `n` output of a persistent GEMM (its blocks stride
/// over them), the product checked.
fn output_tiles(a: &Args, bm: usize, bn: usize) -> GpuResult<usize> {
    let (mt, nt) = (a.dim("m")?.div_ceil(bm), a.dim("n")?.div_ceil(bn));
    mt.checked_mul(nt)
        .ok_or_else(|| GpuError::Invalid(format!("{}: tile count overflows", a.spec.name)))
}

/// `w8a8_wgmma`'s output tiles.
fn w8a8_wgmma_tiles(a: &Args) -> GpuResult<usize> {
    output_tiles(a, W8A8_WGMMA_BM, W8A8_WGMMA_BN)
}

/// `w8a8_wgmma`'s tensor maps: the activation codes [m, kp] in boxes of BM rows, the weight codes
/// [n, kp] in boxes of BN rows, one k stage (BK bytes) wide.
const W8A8_WGMMA_TMAPS: &[TmapRule] = &[
    TmapRule {
        param: "q",
        row_bytes: "kp",
        elem: 1,
        rows: "m",
        box_rows: W8A8_WGMMA_BM,
        box_bytes: W8A8_WGMMA_BK,
    },
    TmapRule {
        param: "w",
        row_bytes: "kp",
        elem: 1,
        rows: "n",
        box_rows: W8A8_WGMMA_BN,
        box_bytes: W8A8_WGMMA_BK,
    },
];

/// `int8_wgmma`'s tensor maps: `w8a8_wgmma`'s under the int8 GEMM's names.
const INT8_WGMMA_TMAPS: &[TmapRule] = &[
    TmapRule {
        param: "aq",
        ..W8A8_WGMMA_TMAPS[0]
    },
    TmapRule {
        param: "wq",
        ..W8A8_WGMMA_TMAPS[1]
    },
];

/// The dequantizing wgmma GEMMs' output tiles.
fn dq_wgmma_tiles(a: &Args) -> GpuResult<usize> {
    output_tiles(a, DQ_WGMMA_BM, DQ_WGMMA_BN)
}

/// The dequantizing wgmma GEMMs' tensor map: the bf16 activations [m, k] in boxes of BM rows and
/// 64 elements (one 128-byte swizzle row).
const DQ_WGMMA_TMAPS: &[TmapRule] = &[TmapRule {
    param: "x",
    row_bytes: "k",
    elem: 2,
    rows: "m",
    box_rows: DQ_WGMMA_BM,
    box_bytes: 128,
}];

/// Rows up to which the FP8 activation quantizer spreads a row over several blocks (decode).
const FP8_QUANT_SPLIT_ROWS: usize = 16;
/// Columns per block when it does (one per thread): every block also reads the whole row once
/// for its amax.
/// Elements a block of `blob_rules` checks (256 threads, 16 each).
pub const RULES_BLOCK_ELEMS: usize = 256 * 16;

/// `stream_probe`'s blocks: one per `per` 16-byte words of `count`.
fn probe_blocks(a: &Args) -> GpuResult<usize> {
    Ok(a.dim("count")?.div_ceil(a.dim("per")?.max(1)))
}

const FP8_QUANT_SPLIT_COLS: usize = FP8_QUANT_THREADS;

/// Column blocks per row of `quantize_act_fp8_row`: `kp / 1024` for a few rows, else one (each
/// block reads its row whole, so splitting a long batch would multiply the reads).
fn fp8_quant_column_blocks(a: &Args) -> GpuResult<usize> {
    Ok(if a.dim("m")? <= FP8_QUANT_SPLIT_ROWS {
        a.dim("kp")?.div_ceil(FP8_QUANT_SPLIT_COLS).max(1)
    } else {
        1
    })
}

macro_rules! kernel_table {
    ($($field:ident: $module:literal $name:literal ($params:literal)
        grid($x:expr, $y:expr, $t:expr $(, smem $smem:expr)? $(, persistent $pers:literal)?),
        cap $cap:expr, round $round:ident $(, tmaps $tmaps:expr)? $(, dependent $dep:literal)?;)*) => {
        /// Every kernel, in one table.
        pub static KERNELS: [KernelSpec; [$(stringify!($field)),*].len()] = [$(KernelSpec {
            field: stringify!($field),
            module: $module,
            name: $name,
            params: $params,
            grid: Grid {
                x: $x,
                y: $y,
                threads: $t,
                smem: 0 $(+ $smem)?,
                persistent: false $(|| $pers)?,
            },
            row_cap: $cap,
            round: ActRound::$round,
            // The rules given, else none (the array's first element).
            tmaps: [$($tmaps,)? &[] as &[TmapRule]][0],
            dependent: false $(|| $dep)?,
            parsed: std::sync::OnceLock::new(),
        },)*];

        /// Every kernel the layer may launch, resolved once at construction.
        #[derive(Clone, Copy, Debug)]
        pub struct Kernels { $(
            #[doc = concat!("`", $module, "::", $name, "`")]
            pub $field: Kernel,
        )* }

        impl Kernels {
            /// Look every kernel of the table up in `b`.
            pub fn resolve(b: &dyn GpuBackend) -> Self {
                Kernels { $($field: {
                    let spec = spec($module, $name).expect("in the table");
                    Kernel { handle: b.kernel($module, $name), spec }
                },)* }
            }
        }
    };
}

kernel_table! {
    act_silu: "ffn_act" "act_mul_silu" ("g:p u:p out:p rows:i cols:i gs:i us:i os:i")
        grid(Per("cols", 256), Per("rows", 1), 256), cap None, round None, dependent true;
    act_gelu: "ffn_act" "act_mul_gelu" ("g:p u:p out:p rows:i cols:i gs:i us:i os:i")
        grid(Per("cols", 256), Per("rows", 1), 256), cap None, round None, dependent true;
    act_silu_il8: "ffn_act" "act_mul_silu_il8" ("g:p u:p out:p rows:i cols:i gs:i us:i os:i")
        grid(Per("cols", 256), Per("rows", 1), 256), cap None, round None, dependent true;
    act_gelu_il8: "ffn_act" "act_mul_gelu_il8" ("g:p u:p out:p rows:i cols:i gs:i us:i os:i")
        grid(Per("cols", 256), Per("rows", 1), 256), cap None, round None, dependent true;
    to_bf16: "ffn_act" "f32_to_bf16" ("x:p y:p count:i")
        grid(Per("count", 256), One, 256), cap None, round None;
    to_bf16_il8: "ffn_act" "f32_to_bf16_il8" ("x:p y:p count:i")
        grid(Per("count", 256), One, 256), cap None, round None;
    fp8_b4: "ffn_fp8" "w8a16_gemv_batch4" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", FP8_GEMV_ROWS), One, 256), cap Some(4), round None, dependent true;
    fp8_b4_cvt: "ffn_fp8" "w8a16_gemv_batch4_cvt" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", FP8_GEMV_ROWS), One, 256), cap Some(4), round None, dependent true;
    fp8_mma: "ffn_fp8" "w8a16_gemv_mma" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", FP8_MMA_GEMV_ROWS), One, 32 * FP8_MMA_GEMV_WARPS), cap Some(8), round Bf16, dependent true;
    fp8_mma_ilp: "ffn_fp8" "w8a16_gemv_mma_ilp" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", FP8_MMA_GEMV_ROWS), One, 32 * FP8_MMA_GEMV_WARPS), cap Some(8), round Bf16, dependent true;
    fp8_b16: "ffn_fp8" "w8a16_gemv_batch16" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 16), One, 256), cap Some(16), round None, dependent true;
    fp8_m16: "ffn_fp8" "w8a16_gemm_m16" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 128), One, 128), cap Some(16), round Bf16;
    fp8_pipe: "ffn_fp8" "w8a16_gemm_pipelined" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round Bf16;
    fp8_base: "ffn_fp8" "w8a16_gemm" ("x:p m:i w:p s:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 64), Per("m", 64), 256), cap None, round None;
    quant_fp8_row: "ffn_w8a8" "quantize_act_fp8_row" ("x:p m:i k:i kp:i q:p sx:p")
        grid(Rule(fp8_quant_column_blocks), Per("m", 1), FP8_QUANT_THREADS), cap None, round None;
    quant_fp8_act: "ffn_w8a8" "quantize_act_mul_fp8_row"
        ("g:p u:p gs:i us:i act:i m:i k:i kp:i q:p sx:p")
        grid(Rule(fp8_quant_column_blocks), Per("m", 1), FP8_QUANT_THREADS), cap None, round None;
    quant_fp8_g128: "ffn_w8a8" "quantize_act_fp8_g128" ("x:p m:i k:i kp:i q:p sx:p")
        grid(Per("kp", FP8_G128_COLS), Per("m", 1), 256), cap None, round None;
    quant_fp8_act_g128: "ffn_w8a8" "quantize_act_mul_fp8_g128"
        ("g:p u:p gs:i us:i act:i m:i k:i kp:i q:p sx:p")
        grid(Per("kp", FP8_G128_COLS), Per("m", 1), 256), cap None, round None;
    w8a8_gemm: "ffn_w8a8" "w8a8_gemm" ("q:p sx:p m:i w:p sw:p y:p n:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round None;
    w8a8_gemv: "ffn_w8a8" "w8a8_gemv" ("q:p sx:p m:i w:p sw:p y:p n:i kp:i ldy:i")
        grid(Per("n", 32), One, 128), cap Some(16), round None;
    w8a8_wgmma: "ffn_w8a8_wgmma" "w8a8_wgmma" ("q:t sx:p m:i w:t sw:p y:p n:i kp:i ldy:i")
        grid(Rule(w8a8_wgmma_tiles), One, W8A8_WGMMA_THREADS, smem W8A8_WGMMA_SMEM, persistent true),
        cap None, round None, tmaps W8A8_WGMMA_TMAPS;
    fp8_wgmma: "ffn_w8a8_wgmma" "fp8_wgmma" ("q:t sx:p m:i w:t s:p y:p n:i kp:i ldy:i")
        grid(Rule(w8a8_wgmma_tiles), One, W8A8_WGMMA_THREADS, smem W8A8_WGMMA_SMEM, persistent true),
        cap None, round None, tmaps W8A8_WGMMA_TMAPS;
    int8_wgmma: "ffn_w8a8_wgmma" "int8_wgmma" ("aq:t sa:p m:i wq:t sw:p y:p n:i kp:i ldy:i")
        grid(Rule(w8a8_wgmma_tiles), One, W8A8_WGMMA_THREADS, smem W8A8_WGMMA_SMEM, persistent true),
        cap None, round None, tmaps INT8_WGMMA_TMAPS;
    nvfp4_wgmma: "ffn_w8a8_wgmma" "nvfp4_wgmma"
        ("x:t m:i tiles:p g:f y:p n:i np:i k:i kp:i ldy:i")
        grid(Rule(dq_wgmma_tiles), One, DQ_WGMMA_THREADS, smem DQ_WGMMA_SMEM, persistent true),
        cap None, round Bf16, tmaps DQ_WGMMA_TMAPS;
    q4k_wgmma: "ffn_w8a8_wgmma" "q4k_wgmma" ("x:t m:i w:p y:p n:i k:i kp:i ldy:i")
        grid(Rule(dq_wgmma_tiles), One, DQ_WGMMA_THREADS, smem DQ_WGMMA_SMEM, persistent true),
        cap None, round Bf16, tmaps DQ_WGMMA_TMAPS;
    w8a8_wgmma_m64: "ffn_w8a8_wgmma" "w8a8_wgmma_m64" ("q:p sx:p m:i w:p sw:p y:p n:i kp:i ldy:i")
        grid(One, Per("n", W8A8_WGMMA_SMALL_BN), 128, smem W8A8_WGMMA_SMALL_SMEM),
        cap Some(W8A8_WGMMA_SMALL_BM), round None;
    bf16_gemv: "ffn_bf16" "bf16_gemv_batch4" ("x:p m:i w:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", BF16_GEMV_ROWS), One, 256), cap Some(4), round None, dependent true;
    stream_probe: "probe" "stream_probe" ("p:p count:i per:i sink:p")
        grid(Rule(probe_blocks), One, 256), cap None, round None;
    blob_rules: "rules" "blob_rules" ("p:p n:i kind:i top:i bad:p slot:i")
        grid(Per("n", RULES_BLOCK_ELEMS), One, 256), cap None, round None;
    nvfp4_gemv_dual: "ffn_nvfp4" "w4a16_gemv_dual"
        ("x:p m:i cg:p sg:p gg:f yg:p cu:p su:p gu:f yu:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), Fixed(2), DUAL_T), cap Some(4), round Bf16, dependent true;
    nvfp4_gemv: "ffn_nvfp4" "w4a16_gemv" ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), One, ONE_T), cap Some(4), round Bf16, dependent true;
    nvfp4_gemm: "ffn_nvfp4" "w4a16_gemm" ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round Bf16;
    nvfp4_gemv_b2: "ffn_nvfp4" "w4a16_gemv_batch2"
        ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), One, ONE_T), cap Some(2), round Bf16, dependent true;
    nvfp4_gemv_b3: "ffn_nvfp4" "w4a16_gemv_batch3"
        ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), One, ONE_T), cap Some(3), round Bf16, dependent true;
    nvfp4_gemv_dual_b2: "ffn_nvfp4" "w4a16_gemv_dual_batch2"
        ("x:p m:i cg:p sg:p gg:f yg:p cu:p su:p gu:f yu:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), Fixed(2), DUAL_T), cap Some(2), round Bf16, dependent true;
    nvfp4_gemv_dual_b3: "ffn_nvfp4" "w4a16_gemv_dual_batch3"
        ("x:p m:i cg:p sg:p gg:f yg:p cu:p su:p gu:f yu:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), Fixed(2), DUAL_T), cap Some(3), round Bf16, dependent true;
    nvfp4_silu_down: "ffn_nvfp4" "w4a16_gemv_silu_down"
        ("gate:p up:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i ldx:i")
        grid(Per("n", COLS), One, ONE_T), cap Some(4), round Bf16, dependent true;
    nvfp4_gemv_ksplit: "ffn_nvfp4" "w4a16_gemv_ksplit"
        ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 4), One, 256), cap Some(4), round None;
    nvfp4_gemm_t: "ffn_nvfp4" "w4a16_gemm_t" ("x:p m:i ct:p st:p g:f y:p n:i np:i k:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round Bf16;
    nvfp4_gemm_t_k64: "ffn_nvfp4" "w4a16_gemm_t_k64"
        ("x:p m:i ct:p st:p g:f y:p n:i np:i k:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round Bf16;
    nvfp4_gemm_t_m128: "ffn_nvfp4" "w4a16_gemm_t_m128"
        ("x:p m:i ct:p st:p g:f y:p n:i np:i k:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 128), 256), cap None, round Bf16;
    nvfp4_gemm_t_m128_v2: "ffn_nvfp4" "w4a16_gemm_t_m128_v2"
        ("x:p m:i ct:p st:p g:f y:p n:i np:i k:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 128), 256), cap None, round Bf16;
    nvfp4_mmq_gemm: "ffn_nvfp4" "nvfp4_mmq_gemm"
        ("x:p m:i tiles:p g:f y:p n:i np:i k:i kp:i ldy:i")
        grid(Per("np", 128), Per("m", 64), 128), cap None, round Bf16;
    quant_nvfp4: "ffn_nvfp4" "quantize_act_nvfp4" ("x:p m:i k:i kp:i qc:p qs:p qg:p")
        grid(Per("m", 1), One, 256), cap None, round None;
    q2_gemv: "ffn_q2g128" "q2g128_gemv" ("x:p m:i w:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 8), One, 256), cap Some(1), round None;
    q2_gemv_m: "ffn_q2g128" "q2g128_gemv_batchm" ("x:p m:i w:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", 8), One, 256), cap Some(4), round None;
    q2_dequant: "ffn_q2g128" "q2g128_dequant_bf16" ("w:p n:i kp:i out:p")
        // One thread per (row, block, byte): n * kp / 128 * 32 threads.
        grid(Rule(|a| Ok(blocks_of(a, &["n", "kp"], 1)? / 128 * 32)
            .map(|t: usize| t.div_ceil(256))), One, 256), cap None, round None;
    affine4_gemv: "ffn_affine" "affine4_gemv"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Per("projs", 1), 32 * AFFINE_GEMV_WARPS), cap Some(1), round None, dependent true;
    affine4_gemv_m: "ffn_affine" "affine4_gemv_batch4"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Per("projs", 1), 32 * AFFINE_GEMV_WARPS), cap Some(4), round None, dependent true;
    affine4_gemv_m16: "ffn_affine" "affine4_gemv_batch16"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Per("projs", 1), 32 * AFFINE_GEMV_WARPS), cap Some(16), round None, dependent true;
    affine4_gemv_ks: "ffn_affine" "affine4_gemv_ks"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_KS_BLOCK_ROWS), One, 32 * AFFINE_GEMV_WARPS), cap Some(1), round None, dependent true;
    affine8_gemv_ks: "ffn_affine" "affine8_gemv_ks"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_KS_BLOCK_ROWS), One, 32 * AFFINE_GEMV_WARPS), cap Some(1), round None, dependent true;
    affine4_gemv_act: "ffn_affine" "affine4_gemv_act"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p n:i kp:i form:i gshift:i act:i dq:p ds:p kpd:i bitsd:i cnt:p")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Fixed(2), 32 * AFFINE_GEMV_WARPS), cap Some(1), round None, dependent true;
    affine8_gemv_act: "ffn_affine" "affine8_gemv_act"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p n:i kp:i form:i gshift:i act:i dq:p ds:p kpd:i bitsd:i cnt:p")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Fixed(2), 32 * AFFINE_GEMV_WARPS), cap Some(1), round None, dependent true;
    affine8_gemv: "ffn_affine" "affine8_gemv"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Per("projs", 1), 32 * AFFINE_GEMV_WARPS), cap Some(1), round None, dependent true;
    affine8_gemv_m: "ffn_affine" "affine8_gemv_batch4"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Per("projs", 1), 32 * AFFINE_GEMV_WARPS), cap Some(4), round None, dependent true;
    affine8_gemv_m16: "ffn_affine" "affine8_gemv_batch16"
        ("xq:p xs:p m:i cg:p sg:p yg:p cu:p su:p yu:p projs:i n:i kp:i form:i gshift:i ldy:i")
        grid(Per("n", AFFINE_GEMV_BLOCK_ROWS), Per("projs", 1), 32 * AFFINE_GEMV_WARPS), cap Some(16), round None, dependent true;
    affine_from_ggml: "ffn_affine" "affine_from_ggml"
        ("raw:p ty:i n:i k:i kp:i codes:p sb:p bad:p")
        // One thread per group of 32: n * kp / 32 threads.
        grid(Rule(|a| Ok(blocks_of(a, &["n", "kp"], 1)? / 32)
            .map(|t: usize| t.div_ceil(256))), One, 256), cap None, round None;
    affine_from_awq: "ffn_affine" "affine_from_awq"
        ("qweight:p qzeros:p scales:p n:i k:i kp:i group:i sgroup:i codes:p sb:p bad:p")
        // One thread per 32 values of a row: n * kp / 32 threads.
        grid(Rule(|a| Ok(blocks_of(a, &["n", "kp"], 1)? / 32)
            .map(|t: usize| t.div_ceil(256))), One, 256), cap None, round None;
    affine_from_gptq: "ffn_affine" "affine_from_gptq"
        ("qweight:p qzeros:p scales:p g_idx:p bits:i n:i k:i kp:i group:i sgroup:i codes:p sb:p bad:p")
        // One thread per 32 values of a row: n * kp / 32 threads.
        grid(Rule(|a| Ok(blocks_of(a, &["n", "kp"], 1)? / 32)
            .map(|t: usize| t.div_ceil(256))), One, 256), cap None, round None;
    affine_quant: "ffn_affine" "affine_quantize_act"
        ("x:p u:p act:i m:i k:i ld:i kp:i bits:i xq:p xs:p perm:p")
        // One warp per group of 32, 8 warps per block.
        grid(Rule(|a| Ok((a.dim("kp")? / 32).div_ceil(8))), Per("m", 1), 256), cap None, round None, dependent true;
    affine_dequant: "ffn_affine" "affine_dequant_bf16" ("codes:p sb:p n:i kp:i bits:i form:i gshift:i out:p perm:p")
        // One thread per 8 values (one 16-byte store): n * kp / 8 threads.
        grid(Rule(|a| Ok(blocks_of(a, &["n", "kp"], 1)? / 8)
            .map(|t: usize| t.div_ceil(256))), One, 256), cap None, round None;
    affine_gather: "ffn_affine" "affine_gather_bf16" ("x:p u:p act:i perm:p m:i k:i ld:i y:p")
        // One block per row.
        grid(Per("m", 1), One, 256), cap None, round None;
    q2_mmq: "ffn_q2g128" "q2g128_mmq_gemm" ("xq:p m:i w:p y:p n:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round None;
    quant_q8_1: "ffn_q8_1" "quantize_act_q8_1" ("x:p m:i k:i kp:i out:p")
        // One warp per q8_1 block, 8 warps per block.
        grid(Rule(|a| Ok((a.dim("kp")? / 32).div_ceil(8))), Per("m", 1), 256),
        cap None, round None, dependent true;
    quant_act_q8_1: "ffn_q8_1" "quantize_act_mul_q8_1" ("g:p u:p act:i m:i k:i ld:i kp:i out:p")
        // One warp per q8_1 block, 8 warps per block.
        grid(Rule(|a| Ok((a.dim("kp")? / 32).div_ceil(8))), Per("m", 1), 256),
        cap None, round None, dependent true;
    // The same blocks split (every row's codes, then every block's d and s): the one-row
    // engine GEMV's input (`ggml_gemv1`).
    quant_q8_1s: "ffn_q8_1" "quantize_act_q8_1s" ("x:p m:i k:i kp:i out:p")
        // One warp per q8_1 block, 8 warps per block.
        grid(Rule(|a| Ok((a.dim("kp")? / 32).div_ceil(8))), Per("m", 1), 256),
        cap None, round None, dependent true;
    quant_act_q8_1s: "ffn_q8_1" "quantize_act_mul_q8_1s" ("g:p u:p act:i m:i k:i ld:i kp:i out:p")
        // One warp per q8_1 block, 8 warps per block.
        grid(Rule(|a| Ok((a.dim("kp")? / 32).div_ceil(8))), Per("m", 1), 256),
        cap None, round None, dependent true;
    q4k_encode: "ffn_q4k_mmq" "nvfp4_to_q4k" ("codes:p scales:p g:f n:i k:i kp_nv:i kp_q:i out:p")
        // One thread per Q4_K super-block.
        grid(Rule(|a| Ok(blocks_of(a, &["n", "kp_q"], 1)? / 256).map(|t: usize| t.div_ceil(64))),
            One, 64), cap None, round None;
    q4k_int8_encode: "ffn_q4k_mmq" "nvfp4_to_int8_rows"
        ("codes:p scales:p g:f n:i k:i kp_nv:i kp_q:i qc:p qs:p")
        grid(Per("n", 1), One, 256), cap None, round None;
    q4k_gemm: "ffn_q4k_mmq" "q4k_mmq_gemm" ("xq:p m:i w:p y:p n:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round None;
    ggml_gemv: "ffn_ggml" "ggml_gemv"
        ("xq:p m:i w:p ty:i sc:f y:p w2:p ty2:i sc2:f y2:p projs:i n:i kp:i ldy:i")
        grid(Per("n", GGML_GEMV_ROWS), Per("projs", 1), 256), cap Some(GGML_GEMV_MAX_M), round None, dependent true;
    // The same GEMV, each launch block's activations shared through shared memory (the
    // layer's from 2 rows).
    ggml_gemv_sa: "ffn_ggml" "ggml_gemv_sa"
        ("xq:p m:i w:p ty:i sc:f y:p w2:p ty2:i sc2:f y2:p projs:i n:i kp:i ldy:i")
        grid(Per("n", GGML_GEMV_ROWS), Per("projs", 1), 256), cap Some(GGML_GEMV_MAX_M), round None, dependent true;
    // One row (the layer's): stages by cp.async, registers for more launch blocks an SM, the
    // activations split (`quant_q8_1s`).
    ggml_gemv1: "ffn_ggml" "ggml_gemv1"
        ("xq:p m:i w:p ty:i sc:f y:p w2:p ty2:i sc2:f y2:p projs:i n:i kp:i ldy:i")
        grid(Per("n", GGML_GEMV1_WARPS), Per("projs", 1), 32 * GGML_GEMV1_WARPS), cap Some(1), round None, dependent true;
    // A/B: the one-row form's for up to GGML_GEMV_SPLIT_M rows, the activations split.
    ggml_gemv_split: "ffn_ggml" "ggml_gemv_split"
        ("xq:p m:i w:p ty:i sc:f y:p w2:p ty2:i sc2:f y2:p projs:i n:i kp:i ldy:i")
        grid(Per("n", GGML_GEMV1_WARPS), Per("projs", 1), 32 * GGML_GEMV1_WARPS), cap Some(GGML_GEMV_SPLIT_M), round None, dependent true;
    // The same form for up to GGML_GEMV_SPLIT4_M rows.
    ggml_gemv_split4: "ffn_ggml" "ggml_gemv_split4"
        ("xq:p m:i w:p ty:i sc:f y:p w2:p ty2:i sc2:f y2:p projs:i n:i kp:i ldy:i")
        grid(Per("n", GGML_GEMV1_WARPS), Per("projs", 1), 32 * GGML_GEMV1_WARPS), cap Some(GGML_GEMV_SPLIT4_M), round None, dependent true;
    ggml_dequant: "ffn_ggml" "ggml_dequant_bf16" ("w:p ty:i sc:f n:i kp:i out:p")
        // One thread per 32-value block: n * kp / 32 threads.
        grid(Rule(|a| Ok(a.dim("n")?
            .checked_mul(a.dim("kp")? / 32)
            .ok_or_else(|| GpuError::Invalid("ggml_dequant_bf16: grid overflows".into()))?
            .div_ceil(256))), One, 256), cap None, round None;
    q4k_gemv: "ffn_q4k_mmq" "q4k_gemv" ("x:p m:i w:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", Q4K_GEMV_ROWS), One, 256), cap Some(1), round None;
    q4k_gemv_m: "ffn_q4k_mmq" "q4k_gemv_batch4" ("x:p m:i w:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", Q4K_GEMV_M_ROWS), One, 256), cap Some(4), round None;
    int8_gemv: "ffn_q4k_mmq" "int8_rows_gemv" ("x:p m:i wq:p sw:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", INT8_GEMV_ROWS), One, 256), cap Some(1), round None;
    int8_gemv_m: "ffn_q4k_mmq" "int8_rows_gemv_batch4"
        ("x:p m:i wq:p sw:p y:p n:i k:i kp:i ldy:i")
        grid(Per("n", INT8_GEMV_M_ROWS), One, 256), cap Some(4), round None;
    int8_gemm: "ffn_q4k_mmq" "q4k_mmq_int8_down_gemm"
        ("aq:p sa:p m:i wq:p sw:p y:p n:i kp:i ldy:i")
        grid(Per("n", 128), Per("m", 64), 128), cap None, round None;
    requant_int8: "ffn_q4k_mmq" "requant_a_bf16_int8" ("x:p m:i k:i kp:i qc:p qs:p")
        grid(Per("m", 1), One, 256), cap None, round None;
    lora_a: "ffn_lora" "lora_a" ("x:p m:i k:i ldx:i a:p r:i xa:p")
        grid(Per("r", 8), Per("m", 1), 256), cap None, round None;
    lora_b: "ffn_lora" "lora_b_add" ("xa:p m:i r:i b:p scaling:f y:p n:i ldy:i")
        grid(Per("n", 256), Per("m", 1), 256), cap None, round None;
    nvfp4_small_m4: "ffn_nvfp4" "nvfp4_proj_small_m4"
        ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), One, ONE_T), cap Some(4), round Bf16, dependent true;
    nvfp4_small_m8: "ffn_nvfp4" "nvfp4_proj_small_m8"
        ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), One, ONE_T), cap Some(8), round Bf16, dependent true;
    nvfp4_small_m16: "ffn_nvfp4" "nvfp4_proj_small_m16"
        ("x:p m:i codes:p scales:p g:f y:p n:i k:i kp:i ldy:i")
        grid(Per("n", COLS), One, ONE_T), cap Some(16), round Bf16, dependent true;
    nvfp4_proj_mx: "ffn_nvfp4" "nvfp4_proj_mx"
        ("qc:p qs:p qg:p m:i codes:p scales:p gw:f y:p n:i kp:i ldy:i")
        grid(Per("n", 32), Per("m", 4), 256), cap None, round None;
    nvfp4_repack: "ffn_nvfp4" "nvfp4_mmq_repack" ("codes:p scales:p n:i np:i kp:i out:p")
        // One thread per (tile row, k tile): np / 128 * kp / 64 * 128 threads.
        grid(Rule(|a| Ok((a.dim("np")? / 128)
            .checked_mul(a.dim("kp")? / 64 * 128)
            .ok_or_else(|| GpuError::Invalid("nvfp4_mmq_repack: grid overflows".into()))?
            .div_ceil(256))), One, 256), cap None, round None;
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
