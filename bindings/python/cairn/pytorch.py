"""PyTorch state dicts through cairn: asynchronous save, restore into a model
and an optimizer. Needs torch (CPU tensors); imported only when used.

    import cairn, cairn.pytorch
    with cairn.Checkpointer(comm, config={"mode": "thread"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "train")
        state = saver.load()                       # None when there is no checkpoint
        if state is not None:
            cairn.pytorch.restore_training(state, model, optimizer)
        for step in range(...):
            ...training step...
            if step % 100 == 0:
                saver.save(cairn.pytorch.training_state(model, optimizer, step=step), step)

Read-only, from the store alone (no Checkpointer, nothing recorded in the
run): `state = cairn.pytorch.load("cairn-store", "train.py-1a2b3c4d", "train")`;
`cairn.open(store).region_keys(run, name, version)` and `cairn show` name
each tensor region by its key in the state (`model.fc1.weight`).

How a save is made (docs/format/torch_state.md): every tensor of the (nested) state is protected in place
(its CPU memory, viewed as a numpy array without a copy) and the structure
with every non-tensor value is encoded as JSON into one more region; then
cairn_checkpoint captures them all. With mode = thread (the default) that
capture is a memory copy into cairn's staging memory, and the save returns:
the training step may modify the parameters at once while cairn writes the
copy in the background (wait() or Checkpointer.wait for durability).

What a state may hold: dicts (str or int keys), lists, tuples, None, bool,
int, float, str, torch tensors on the CPU in strided layout (any dtype;
non-contiguous tensors are copied to a contiguous one first, which the
capture then copies again), numpy arrays of numbers (captured like tensors)
and numpy scalars (their type kept): so np.random.get_state(), a
Generator's bit_generator.state and random.getstate() are saved as they are.
A tensor on another device, a sparse or quantized tensor, or a value of
another type is refused with InvalidArgumentError naming it: move the state to
the CPU first.
"""
from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Optional

import numpy as np

from .checkpointer import _TYPES
from .errors import CorruptionError, InvalidArgumentError, NotFoundError, NotSupportedError

STATE_REGION = "__cairn_state__"
STATE_FORMAT = 1
_PREFIX = "t"


def _torch():
    try:
        import torch
    except ImportError as e:
        raise NotSupportedError("cairn.pytorch needs PyTorch: pip install torch") from e
    return torch


def _as_array(t) -> np.ndarray:
    """A numpy view of the contiguous CPU tensor (or numpy array) t, sharing
    its memory: its own dtype and shape where numpy and cairn have that dtype,
    else its bytes."""
    if isinstance(t, np.ndarray):
        if t.dtype in _TYPES and t.dtype.isnative:  # the dtypes Checkpointer.protect takes
            return t
        return t.reshape(-1).view(np.uint8)
    torch = _torch()
    if t.dtype in (torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        return t.detach().numpy()
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def _where(path: List[Any]) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path)


class _Encoder:
    """The structure of a state as JSON, tensors replaced by references to regions."""

    def __init__(self):
        self.tensors: List[Any] = []
        self.pinned: List[str] = []  # where tensors in page-locked memory are (a device may write them)

    def encode(self, v, path):
        torch = _torch()
        if isinstance(v, torch.Tensor):
            return self._tensor(v, path)
        if isinstance(v, np.ndarray):
            return self._ndarray(v, path)
        if isinstance(v, np.generic):
            return self._np_scalar(v, path)
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, float)):
            return v
        if isinstance(v, dict):
            items = []
            for k, x in v.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise InvalidArgumentError(f"{_where(path)}: key {k!r} of type {type(k).__name__}: cairn.pytorch "
                                               "saves dicts with str or int keys")
                items.append([k, self.encode(x, path + [k])])
            if not isinstance(v, OrderedDict):
                return {"dict": items}
            # A module's state_dict: an OrderedDict whose _metadata (module
            # versions) load_state_dict reads.
            out = {"dict": items, "ordered": True}
            meta = getattr(v, "_metadata", None)
            if meta is not None:
                out["metadata"] = self.encode(dict(meta), path + ["_metadata"])
            return out
        if isinstance(v, tuple):
            return {"tuple": [self.encode(x, path + [i]) for i, x in enumerate(v)]}
        if isinstance(v, list):
            return {"list": [self.encode(x, path + [i]) for i, x in enumerate(v)]}
        raise InvalidArgumentError(f"{_where(path)}: a value of type {type(v).__name__} cannot be saved: cairn.pytorch "
                                   "saves tensors, dicts, lists, tuples, None, bool, int, float and str")

    def _tensor(self, t, path):
        torch = _torch()
        if t.device.type != "cpu":
            raise InvalidArgumentError(
                f"{_where(path)}: tensor on device '{t.device}': cairn.pytorch captures CPU tensors in place; copy "
                "the state to the CPU first (for example with .cpu() on each tensor, or save from a CPU model)")
        if t.is_pinned():
            self.pinned.append(_where(path))
        if t.layout != torch.strided or t.is_quantized:
            raise InvalidArgumentError(f"{_where(path)}: tensor of layout {t.layout}"
                                       f"{' (quantized)' if t.is_quantized else ''}: cairn.pytorch saves dense "
                                       "tensors; convert it (.to_dense(), .dequantize()) first")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        if not t.is_contiguous():
            t = t.contiguous()
        ref = {"tensor": len(self.tensors), "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
               "requires_grad": bool(t.requires_grad)}
        self.tensors.append(t)
        return ref

    def _ndarray(self, a, path):
        if a.dtype.kind not in "biufc" or a.dtype.itemsize == 0 or a.dtype == np.longdouble:
            raise InvalidArgumentError(f"{_where(path)}: numpy array of dtype {a.dtype}: cairn.pytorch saves "
                                       "arrays of booleans and numbers (not objects, strings or long double)")
        a = np.ascontiguousarray(a)
        ref = {"tensor": len(self.tensors), "ndarray": True, "dtype": a.dtype.str, "shape": list(a.shape)}
        self.tensors.append(a)
        return ref

    def _np_scalar(self, x, path):
        if x.dtype.kind not in "biufc" or x.dtype == np.longdouble or x.dtype == np.clongdouble:
            raise InvalidArgumentError(f"{_where(path)}: numpy scalar of type {type(x).__name__}: cairn.pytorch "
                                       "saves numpy booleans and numbers (not long double)")
        value = x.item()
        return {"np_scalar": x.dtype.str, "value": [value.real, value.imag] if isinstance(value, complex) else value}


def _decode(v, tensors):
    if isinstance(v, dict):
        if "tensor" in v:
            t = tensors[v["tensor"]]
            if "ndarray" in v:
                return t
            return t.requires_grad_(True) if v.get("requires_grad") and t.is_floating_point() else t
        if "np_scalar" in v:
            value = v["value"]
            return np.dtype(v["np_scalar"]).type(complex(*value) if isinstance(value, list) else value)
        if "dict" in v:
            if not v.get("ordered"):
                return {k: _decode(x, tensors) for k, x in v["dict"]}
            out = OrderedDict((k, _decode(x, tensors)) for k, x in v["dict"])
            if "metadata" in v:
                out._metadata = OrderedDict(_decode(v["metadata"], tensors))
            return out
        if "tuple" in v:
            return tuple(_decode(x, tensors) for x in v["tuple"])
        if "list" in v:
            return [_decode(x, tensors) for x in v["list"]]
        raise ValueError(f"unknown entry {sorted(v)}")
    return v


def _tensor_refs(v, out):
    if isinstance(v, dict):
        if "tensor" in v:
            out.append(v)
        else:
            for x in v.get("dict", []):
                _tensor_refs(x[1], out)
            for key in ("tuple", "list"):
                for x in v.get(key, []):
                    _tensor_refs(x, out)
    return out


def _regions_of(state, capture: str) -> Dict[str, np.ndarray]:
    """The regions a save of `state` protects: each tensor with elements (a
    numpy view of its memory) and the structure's JSON. capture: the
    Checkpointer's capture method."""
    enc = _Encoder()
    tree = enc.encode(state, [])
    if enc.pinned and capture != "copy":
        raise InvalidArgumentError(
            f"{enc.pinned[0]}: tensor in pinned (page-locked) memory, which a GPU writes by DMA without cairn "
            f"seeing it, and capture = {capture} may copy the state after save() returned (copy-on-write): "
            "create the Checkpointer with config={'capture': 'copy'} (save() then copies the state before it "
            "returns), or keep pinned buffers out of the saved state")
    arrays = {}
    for i, t in enumerate(enc.tensors):
        if t.size > 0 if isinstance(t, np.ndarray) else t.numel() > 0:
            arrays[f"{_PREFIX}{i:06d}"] = _as_array(t)
    meta = json.dumps({"format": "cairn-torch-state", "format_version": STATE_FORMAT, "state": tree},
                      separators=(",", ":")).encode()
    arrays[STATE_REGION] = np.frombuffer(bytearray(meta), dtype=np.uint8)
    return arrays


class StateSaver:
    """Saves and loads nested state dicts of tensors as checkpoint `name` of a
    cairn.Checkpointer. save() and load() are collective under MPI (every rank
    saves its own state). The Checkpointer's other protected arrays, if any,
    are saved and restored with it."""

    def __init__(self, checkpointer, name: str):
        self.ck = checkpointer
        self.name = name
        # Regions of the last save or load: name -> (address, dtype, shape).
        self._protected: Dict[str, Any] = {}
        self._saved: Optional[int] = None  # the newest version saved in this execution

    def _set_regions(self, arrays: Dict[str, np.ndarray]) -> None:
        for r in self._protected:
            if r not in arrays:
                self.ck.unprotect(r)
        protected = {}
        for r, a in arrays.items():
            key = (a.__array_interface__["data"][0], a.dtype.str, a.shape)
            # A training loop saves the same tensors again and again: an
            # array already protected where it lies is not protected again
            # (the Checkpointer still holds the view it was given, so the
            # memory at that address is that tensor's).
            if self._protected.get(r) != key:
                self.ck.protect(r, a)
            protected[r] = key
        self._protected = protected

    def prepare(self, state) -> None:
        """Protects the tensors of `state` where they lie without saving them,
        so that cairn makes its staging memory in the background while the
        training goes on, and the first save() of the execution copies like
        the later ones. Without it, the first save finds no staging memory
        and copies into fresh memory (with capture = copy_or_cow: in the
        background, copy-on-write, and the next training step waits for it
        where it writes). Call it once the
        state's tensors exist (after the optimizer's first step, or after
        restore_training)."""
        self._set_regions(_regions_of(state, self.ck._capture))

    def save(self, state, version: int, if_saved: str = "skip") -> bool:
        """Captures `state` as `version` and returns once it is copied (mode
        thread) or written (mode sync); the tensors may change as soon as it
        returns. True when saved.

        Versions grow. A version at or below the newest this saver saved in
        this execution (a step checkpoint and an end-of-epoch save of the
        same step) is, with if_saved="skip" (the default), not saved again: a
        warning says so and False is returned; with if_saved="error" it
        raises InvalidArgumentError."""
        version = int(version)
        if if_saved not in ("skip", "error"):
            raise InvalidArgumentError(f"save: if_saved={if_saved!r}: use 'skip' or 'error'")
        if self._saved is not None and version <= self._saved:
            what = (f"checkpoint '{self.name}' version {version}: version {self._saved} was saved already in "
                    "this execution (versions grow)")
            if if_saved == "error":
                raise InvalidArgumentError(what)
            warnings.warn(what + "; not saved again", RuntimeWarning, stacklevel=2)
            return False
        self._set_regions(_regions_of(state, self.ck._capture))
        self.ck.checkpoint(self.name, version)
        self._saved = version
        return True

    def wait(self, version: int, level: Optional[int] = None) -> None:
        """Blocks until `version` reached `level` (default: persistent) on every rank."""
        if level is None:
            self.ck.wait(self.name, int(version))
        else:
            self.ck.wait(self.name, int(version), level)

    def latest(self) -> Optional[int]:
        return self.ck.latest(self.name)

    def load(self, version: Optional[int] = None):
        """The state saved as `version` (default: the newest restorable one),
        with new CPU tensors, or None when there is none (and no version was
        asked for). Every checksum is verified before anything is returned."""
        _torch()  # fails before the restart begins when torch is absent
        if version is None:
            version = self.latest()
            if version is None:
                return None
        version = int(version)
        ck = self.ck
        ffi, lib = ck._ffi, ck._lib
        ck._check(lib.cairn_restart_begin(ck._handle(), self.name.encode(), version), "cairn_restart_begin")
        ok = False
        try:
            size = ffi.new("uint64_t *")
            rc = lib.cairn_restart_region_size(ck._handle(), STATE_REGION.encode(), size)
            if rc == -2:
                raise NotFoundError(f"checkpoint '{self.name}' version {version} was not saved by cairn.pytorch "
                                    f"(it has no region '{STATE_REGION}')")
            ck._check(rc, "cairn_restart_region_size")
            meta = np.zeros(int(size[0]), dtype=np.uint8)
            self._set_regions({STATE_REGION: meta})
            ck._check(lib.cairn_restart(ck._handle(), self.name.encode(), version), "cairn_restart")
            doc = _parse_state(meta, f"checkpoint '{self.name}' version {version}")
            tensors, arrays = _allocate(doc)
            arrays[STATE_REGION] = meta
            self._set_regions(arrays)
            ck._check(lib.cairn_restart(ck._handle(), self.name.encode(), version), "cairn_restart")
            ok = True
        finally:
            rc = lib.cairn_restart_end(ck._handle(), 1 if ok else 0)
            if ok:
                ck._check(rc, "cairn_restart_end")
        return _decode(doc["state"], tensors)


def _parse_state(meta: np.ndarray, where: str) -> dict:
    """The JSON document of a state region, its format checked."""
    try:
        doc = json.loads(meta.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptionError(f"{where}: region '{STATE_REGION}' is not a cairn.pytorch state ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != "cairn-torch-state" \
            or doc.get("format_version") != STATE_FORMAT:
        fmt = doc.get("format") if isinstance(doc, dict) else None
        ver = doc.get("format_version") if isinstance(doc, dict) else None
        raise NotSupportedError(f"{where}: state format {fmt!r} {ver!r} is not readable by this cairn.pytorch; "
                                "upgrade cairn")
    return doc


def _allocate(doc: dict):
    """New tensors (and numpy arrays) for the state's tensor references:
    (index -> tensor, region name -> numpy view of its memory) for the regions
    to read into (tensors without elements have none)."""
    torch = _torch()
    refs = sorted(_tensor_refs(doc["state"], []), key=lambda r: r["tensor"])
    tensors, arrays = {}, {}
    for r in refs:
        if r.get("ndarray"):
            t = np.empty(r["shape"], dtype=np.dtype(r["dtype"]))
        else:
            t = torch.empty(r["shape"], dtype=getattr(torch, r["dtype"]))
        tensors[r["tensor"]] = t
        if (t.size if isinstance(t, np.ndarray) else t.numel()) > 0:
            arrays[f"{_PREFIX}{r['tensor']:06d}"] = _as_array(t)
    return tensors, arrays


def load(store, run: str, name: str, version: Optional[int] = None, rank: int = 0):
    """The state that cairn.pytorch saved as checkpoint `name` of `run` in
    `store` (a path or a cairn.Store), read-only: nothing is written to the
    store and no execution is recorded (for evaluation, inference, or a
    look at a training job's state while it runs). `version` defaults to the
    newest committed one; `rank` picks the process whose state is read (rank
    0: the model of a data-parallel job). Every checksum is verified.
    NotFoundError when the run has no committed version of `name` (or not
    that version), with what it has."""
    from .store import Store
    s = store if isinstance(store, Store) else Store(store)
    versions = s.versions(run, name)
    if not versions or (version is not None and int(version) not in versions):
        have = s.checkpoints(run) if run in s.runs() else []
        what = (f"versions {', '.join(map(str, versions))}" if versions else
                f"checkpoints {', '.join(have)}" if have else f"runs {', '.join(s.runs()) or 'none'}")
        raise NotFoundError(f"{s.path}: run '{run}' has no committed "
                            f"{'version ' + str(version) + ' of ' if versions else ''}checkpoint '{name}' ({what})")
    version = versions[-1] if version is None else int(version)
    where = f"{s.path}: {run}/{name} version {version} rank {rank}"
    if all(r.name != STATE_REGION for r in s.regions(run, name, version, rank)):
        raise NotFoundError(f"{where} was not saved by cairn.pytorch (it has no region '{STATE_REGION}'); "
                            "read its regions with cairn.open")
    doc = _parse_state(s.region(run, name, version, STATE_REGION, rank=rank), where)
    tensors, arrays = _allocate(doc)
    for region, a in arrays.items():
        s.read_into(run, name, version, region, a, rank=rank)
    return _decode(doc["state"], tensors)


def training_state(model, optimizer=None, **extra) -> dict:
    """{"model": model.state_dict(), "optimizer": optimizer.state_dict(), "extra": extra}."""
    state = {"model": model.state_dict(), "extra": dict(extra)}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    return state


def restore_training(state: dict, model, optimizer=None) -> dict:
    """Loads a training_state into model (and optimizer); returns its extra values."""
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if "optimizer" not in state:
            raise InvalidArgumentError("the saved state has no optimizer state (saved without an optimizer)")
        optimizer.load_state_dict(state["optimizer"])
    return state.get("extra", {})
