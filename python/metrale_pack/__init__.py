"""Open, verify and decode metrale-pack packs, and convert checkpoints to them.

    import metrale_pack
    p = metrale_pack.open("model.mpk.gguf")
    p.manifest["layouts"]             # the manifest as a dict
    w = p.tensor("blk.0.ffn_gate.nvfp4")  # f32 numpy array, decoded as `metrale-pack dump` does
    p.verify()["ok"]                 # every checksum and padding byte
    metrale_pack.convert("model.gguf", "model.mpk.gguf", layouts=["bf16"])

Every failure raises a `metrale_pack.Error` (a `ValueError`) of one of its kinds: `FormatError`
(a file that is not what its format says), `UnsupportedError` (a format or request not read or
served yet), `IoError` (the file system: an unreadable file, an output that is an input),
`DeviceError` (the GPU runtime) or `ArgumentError` (an argument out of range); the message names
the file, tensor and field.
"""

import json
import os as _os

import numpy as np

from . import _native
from ._native import ArgumentError, DeviceError, Error, FormatError, IoError, UnsupportedError

__all__ = ["Pack", "Loaded", "DeviceTensor", "open", "convert", "CONVERT_OPTIONS", "load", "Error", "FormatError",
           "UnsupportedError", "IoError", "DeviceError", "ArgumentError"]

# A pack type's numpy dtype; any other type (quantized ggml blocks, FFN blobs) is uint8 bytes.
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"),
           "I8": np.int8, "I16": np.dtype("<i2"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8")}


class Pack:
    """A pack, opened once: its manifest, tensors and checks."""

    def __init__(self, path):
        self.path, self.manifest = str(path), {}
        self._p = _native.Pack(str(path))
        self.manifest = json.loads(self._p.manifest_json())

    def __repr__(self):
        man = getattr(self, "manifest", {})
        return (f"Pack({getattr(self, 'path', None)!r}, {len(man.get('tensors', []))} tensors, "
                f"layouts {man.get('layouts')}, {man.get('model', {}).get('ffn_layers')} FFN layers)")

    def tensor_names(self):
        """Every tensor's name, in file order."""
        return self._p.tensor_names()

    def tensor(self, name, decode=True):
        """Tensor `name` as a numpy array: f32 decoded (an FFN blob through its layout, padding
        removed), or with decode=False its stored bytes as a 1-D uint8 array."""
        data, shape, dtype = self._p.tensor(name, decode)
        dt = np.dtype("<f4") if dtype == "f32" else np.uint8
        return np.frombuffer(data, dtype=dt).reshape(shape)

    def verify(self, source=None):
        """Every check `metrale-pack verify --json` runs, as a dict (`ok` says whether all
        passed); with `source`, every tensor re-derived from that checkpoint."""
        return json.loads(self._p.verify(None if source is None else str(source)))


def open(path):
    """Open the pack at `path`."""
    return Pack(path)


#: The options `convert` takes, as (name, kind, help): the command line's `convert` flags and
#: C's `mp_convert` names, from the one table every surface reads.
CONVERT_OPTIONS = _native.convert_options()


def _words(name, value):
    """An option's value in words, as the library reads it (a list: one value per item)."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if isinstance(value, (str, int, _os.PathLike)):
        return [_os.fspath(value) if isinstance(value, _os.PathLike) else str(value)]
    raise ArgumentError(f"{name}: a bool, number, string, path or list, not {type(value).__name__}")


def convert(src, out, *, progress=None, **options):
    """Convert the checkpoint `src` into a pack at `out` as `metrale-pack convert` does, with
    its options as keywords (`CONVERT_OPTIONS`: `layouts=["bf16"]`, `tp=2`,
    `allow_requantize=True`, ...; None leaves one at its default). The layouts are those that
    keep the source's format unless `layouts` names them; a set that would re-quantize quantized
    weights is refused unless `allow_requantize`. An `out` that is one of the checkpoint's files
    (through any path, symlink or hard link) is refused. `progress(done, total)` is called on
    this thread with source bytes as the convert goes; Ctrl-C, or an exception from `progress`,
    stops the convert before its next tensor, writes nothing, and is raised. Returns the
    manifest."""
    given = [(k, w) for k, v in options.items() if v is not None for w in _words(k, v)]
    return json.loads(_native.convert(str(src), str(out), given, progress))


class Loaded:
    """A pack loaded by the engine loader: every device tensor copied, every layer installed and
    checked to forward. Freed by `close()` or when the object goes."""

    def __init__(self, native, path=None, device=None):
        self._m = native
        self.path, self.device = path, device

    def __repr__(self):
        try:
            n = f"{len(self._m.tensor_names())} device tensors"
        except Error:
            n = "closed"
        return f"Loaded({self.path!r}, device {self.device!r}, {n})"

    def tensor_names(self):
        """Every device tensor's name, in pack order."""
        return self._m.tensor_names()

    def tensor(self, name):
        """Device tensor `name` as a numpy array copied from the device: its stored dtype and
        shape for F32/F16 and integer tensors, else (BF16, quantized types, FFN blobs) uint8
        bytes. An FFN blob's layout descriptor (layout, proj, part, shape, padded, scalars) is
        `layout(name)`."""
        data, shape, ty, _ = self._m.tensor(name)
        dt = _DTYPES.get(ty)
        if dt is None or ty == "I8":
            return np.frombuffer(data, dtype=np.uint8)
        return np.frombuffer(data, dtype=dt).reshape(shape)

    def layout(self, name):
        """An FFN blob's manifest entry (layout, projection, part, shapes, scalars), or None."""
        ffn = self._m.tensor(name)[3]
        return None if ffn is None else json.loads(ffn)

    def forward(self, layer, x, arm=None):
        """Dense FFN layer `layer` on the f32 rows `x` ([rows, hidden]), through the arm the
        routing picks for that many rows (at most `max_rows`), or with `arm` through that arm
        (a name of `arms(layer)`, any number of rows: what `metrale-pack ffn-apply --arm` runs);
        the output as [rows, hidden] f32."""
        x = np.ascontiguousarray(x, dtype="<f4")
        if x.ndim != 2:
            raise ArgumentError(f"forward: x is {x.shape}, needs [rows, hidden]")
        if arm is None:
            y = self._m.forward(layer, x.tobytes(), x.shape[0])
        else:
            y = self._m.forward_arm(layer, arm, x.tobytes(), x.shape[0])
        return np.frombuffer(y, dtype="<f4").reshape(x.shape)

    def arms(self, layer):
        """The names of the arms layer `layer` can run (`bf16`, `nvfp4 fixed (W4A4)`, ...)."""
        return list(self._m.arms(layer))

    def forward_into(self, layer, x, out=None):
        """Dense FFN layer `layer` on `x` (f32 [rows, hidden], contiguous, on the load's
        device: a torch tensor, or on the host backend a numpy array) into `out` (made like `x`
        when not given), returned. On CUDA it runs on torch's current stream, reading `x` in
        place (no copy) and writing `out` there, ordered like any torch operation."""
        stream = 0
        if out is None:
            out = x.new_empty(x.shape) if hasattr(x, "new_empty") else np.empty_like(x)
        if getattr(x, "is_cuda", False):
            import torch

            stream = torch.cuda.current_stream(x.device).cuda_stream
            # DLPack names the legacy default stream 1 (0 is ambiguous there).
            dl = stream if stream != 0 else 1
            caps = (x.__dlpack__(stream=dl), out.__dlpack__(stream=dl))
        else:
            caps = (x.__dlpack__(), out.__dlpack__())
        self._m.forward_dlpack(layer, caps[0], caps[1], stream)
        return out

    def dlpack(self, name, raw=False):
        """Device tensor `name` as an object with `__dlpack__` (no copy): its dtype and shape
        for float and integer tensors (BF16 included), else, or with `raw`, its bytes as uint8
        [bytes]. `torch.from_dlpack` takes it on any device, `numpy.from_dlpack` on the host."""
        return DeviceTensor(self._m, name, raw)

    def torch(self, name, raw=False):
        """Device tensor `name` as a torch tensor on the load's device, sharing its memory."""
        import torch

        return torch.from_dlpack(self.dlpack(name, raw))

    def torch_tensors(self, raw=False):
        """Every device tensor as a torch tensor, by name (no copy)."""
        return {n: self.torch(n, raw) for n in self.tensor_names()}

    def close(self):
        """Let go of the loaded pack: the device segment, the layers and the context are freed
        now, or when the last tensor exported from it dies."""
        self._m.close()


class DeviceTensor:
    """One device tensor of a loaded pack, for `from_dlpack` (the DLPack protocol). The loaded
    pack stays alive until every tensor made from it is gone."""

    def __init__(self, native, name, raw=False):
        self._m, self.name, self._raw = native, name, raw

    def __repr__(self):
        return f"DeviceTensor({self.name!r}{', raw' if self._raw else ''})"

    def __dlpack__(self, stream=None, **_kwargs):
        # The load synchronized its copies: the bytes are ready for any stream.
        return self._m.dlpack(self.name, self._raw)

    def __dlpack_device__(self):
        return self._m.dlpack_device()


def load(path, device="cpu", verify_checksums=False, max_rows=16):
    """Load the pack at `path` with the engine loader (forward calls of up to `max_rows` rows, at
    most 65536; more is refused, naming `max_rows`) onto `device`: "cuda" or "cuda:N" (torch's primary context), or "cpu" (the host backend, what
    CI runs). Device tensors come out through `dlpack`/`torch` without a copy."""
    return Loaded(_native.load(str(path), device, verify_checksums, max_rows), str(path), device)

