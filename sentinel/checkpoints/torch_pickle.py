"""Read what a pickle holds without unpickling it: an inert walk of its opcodes.

``torch.save`` files (and DCP's ``.metadata``) are pickles, and unpickling runs
whatever callables the file names: a checkpoint found on disk is not trusted
input. This module replays the opcodes from ``pickletools.genops`` on a stack of
plain values instead. A global becomes a :class:`Global` naming it, a call
(REDUCE, NEWOBJ, BUILD) becomes an :class:`Instance` recording the callable and
its arguments, a persistent id (a tensor's storage) a :class:`Persistent`.
Nothing is imported, called or constructed, so a file whose unpickling would run
``os.system`` is read like any other.
"""

from __future__ import annotations

import io
import logging
import pickletools
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

log = logging.getLogger(__name__)

# A torch archive's data.pkl holds the structure only (tensor bytes are separate
# members); a few MB for a large model. Beyond this the walk is not worth its time.
MAX_PICKLE_BYTES = 64 * 1024 * 1024
# Legacy (pre-1.6) torch.save streams: magic number, protocol, sys info, then the object.
_LEGACY_OBJECT_INDEX = 3

STEP_KEYS = ("global_step", "step", "iter_num", "iteration", "global_steps")
EPOCH_KEYS = ("epoch",)


class PickleWalkError(ValueError):
    """The bytes are not a pickle the inert walk can follow."""


class Global(NamedTuple):
    """A ``module.name`` the pickle refers to (never imported)."""

    module: str
    name: str


@dataclass(eq=False)
class Instance:
    """What a call in the pickle would have built: the callable, its arguments, its state."""

    factory: object
    args: tuple[object, ...] = ()
    state: object = None
    items: dict[object, object] = field(default_factory=dict)
    appended: list[object] = field(default_factory=list)


@dataclass(frozen=True)
class Persistent:
    """A persistent id (in a torch archive: a tensor's storage record)."""

    pid: object


class _Mark:
    pass


_MARK = _Mark()


def walk(source: bytes | IO[bytes]) -> object:
    """Return the inert value of one pickle (up to its STOP opcode)."""
    stack: list[object] = []
    marks: list[int] = []
    memo: dict[object, object] = {}
    items: list[object]
    factory: object

    def pop_mark() -> list[object]:
        if not marks:
            raise PickleWalkError("MARK expected")
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    def pop() -> object:
        if not stack:
            raise PickleWalkError("stack underflow")
        return stack.pop()

    def top() -> object:
        if not stack:
            raise PickleWalkError("stack underflow")
        return stack[-1]

    try:
        for opcode, arg, _ in pickletools.genops(source):
            name = opcode.name
            if name in _PUSH_ARG:
                stack.append(arg)
            elif name in ("PROTO", "FRAME"):
                continue
            elif name == "STOP":
                return pop()
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "NONE":
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name in ("EMPTY_LIST", "EMPTY_SET"):
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name in ("LIST", "FROZENSET"):
                stack.append(pop_mark())
            elif name == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(name[-1])
                if len(stack) < count:
                    raise PickleWalkError("stack underflow")
                packed = tuple(stack[-count:])
                del stack[-count:]
                stack.append(packed)
            elif name == "DICT":
                items = pop_mark()
                stack.append(_pairs_into({}, items))
            elif name in ("APPEND", "APPENDS", "ADDITEMS"):
                items = [pop()] if name == "APPEND" else pop_mark()
                _extend(top(), items)
            elif name in ("SETITEM", "SETITEMS"):
                if name == "SETITEM":
                    value = pop()
                    items = [pop(), value]
                else:
                    items = pop_mark()
                target = top()
                if isinstance(target, Instance):
                    target = target.items
                if isinstance(target, dict):
                    _pairs_into(target, items)
            elif name == "POP":
                pop()
            elif name == "DUP":
                stack.append(top())
            elif name == "POP_MARK":
                pop_mark()
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise PickleWalkError(f"memo key {arg!r} unset")
                stack.append(memo[arg])
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = top()
            elif name == "MEMOIZE":
                memo[len(memo)] = top()
            elif name in ("GLOBAL", "INST"):
                module_name, _, attr_name = str(arg).partition(" ")
                factory = Global(module_name, attr_name)
                stack.append(factory if name == "GLOBAL" else Instance(factory, tuple(pop_mark())))
            elif name == "STACK_GLOBAL":
                attr, module = pop(), pop()
                stack.append(Global(str(module), str(attr)))
            elif name in ("EXT1", "EXT2", "EXT4"):
                stack.append(Global("copyreg extension", str(arg)))
            elif name in ("REDUCE", "NEWOBJ"):
                args, factory = pop(), pop()
                stack.append(Instance(factory, args if isinstance(args, tuple) else (args,)))
            elif name == "NEWOBJ_EX":
                kwargs, args, factory = pop(), pop(), pop()
                stack.append(Instance(factory, (args, kwargs)))
            elif name == "OBJ":
                factory, *rest = pop_mark() or [None]
                stack.append(Instance(factory, tuple(rest)))
            elif name == "BUILD":
                state = pop()
                if stack and isinstance(stack[-1], Instance):
                    stack[-1].state = state
            elif name == "PERSID":
                stack.append(Persistent(arg))
            elif name == "BINPERSID":
                stack.append(Persistent(pop()))
            elif name in ("NEXT_BUFFER", "READONLY_BUFFER"):
                stack.append(Global("pickle", "PickleBuffer"))
            else:
                raise PickleWalkError(f"opcode {name} is not followed")
    except (ValueError, IndexError, TypeError, EOFError) as exc:
        if isinstance(exc, PickleWalkError):
            raise
        raise PickleWalkError(f"not a pickle: {exc}") from exc
    raise PickleWalkError("no STOP opcode: the pickle is cut short")


_PUSH_ARG = frozenset(
    {
        "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
        "FLOAT", "BINFLOAT",
        "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
        "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
        "BYTEARRAY8",
    }
)  # fmt: skip


def _pairs_into(target: dict[object, object], items: list[object]) -> dict[object, object]:
    for key, value in zip(items[::2], items[1::2], strict=False):
        try:
            target[key] = value
        except TypeError:
            continue  # an unhashable key the real object could not have had either
    return target


def _extend(target: object, items: list[object]) -> None:
    if isinstance(target, Instance):
        target.appended.extend(items)
    elif isinstance(target, list):
        target.extend(items)


def torch_object(path: Path) -> object:
    """Return the inert value of the object a ``torch.save`` file holds.

    Raises :class:`PickleWalkError` when the file is neither a torch zip archive
    with a ``data.pkl`` nor a legacy pickle stream, or when its pickle is larger
    than :data:`MAX_PICKLE_BYTES`; ``OSError`` when it cannot be read.
    """
    with path.open("rb") as handle:
        magic = handle.read(2)
        handle.seek(0)
        if magic == b"PK":
            return _archive_object(handle)
        if magic[:1] == b"\x80":
            return _legacy_object(handle)
    raise PickleWalkError("neither a torch zip archive nor a legacy pickle")


def archive_object(data: bytes) -> object:
    """Return the inert value of a ``torch.save`` archive held in memory."""
    return _archive_object(io.BytesIO(data))


def _archive_object(handle: IO[bytes]) -> object:
    try:
        with zipfile.ZipFile(handle) as archive:
            member = next(
                (i for i in archive.infolist() if i.filename.rsplit("/", 1)[-1] == "data.pkl"),
                None,
            )
            if member is None:
                raise PickleWalkError("torch archive has no data.pkl")
            if member.file_size > MAX_PICKLE_BYTES:
                raise PickleWalkError(f"data.pkl of {member.file_size} bytes is too large to walk")
            return walk(archive.read(member))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as exc:
        raise PickleWalkError(f"torch zip archive unreadable: {exc}") from exc


def _legacy_object(handle: IO[bytes]) -> object:
    value: object = None
    for _ in range(_LEGACY_OBJECT_INDEX + 1):
        if handle.tell() > MAX_PICKLE_BYTES:
            raise PickleWalkError("legacy pickle too large to walk")
        value = walk(handle)
    return value


def top_level(value: object) -> dict[str, object]:
    """Return the string-keyed items of a pickled dict (or OrderedDict), else {}."""
    if isinstance(value, Instance):
        value = value.items
    if not isinstance(value, dict):
        return {}
    return {key: item for key, item in value.items() if isinstance(key, str)}


def int_under(mapping: dict[str, object], keys: tuple[str, ...]) -> tuple[str, int] | None:
    """Return the first of ``keys`` whose value is a plain integer (not a bool), with it."""
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return key, value
    return None


def instances_of(value: object, class_name: str) -> Iterator[Instance]:
    """Yield every :class:`Instance` built by a global named ``class_name``, depth first."""
    seen: set[int] = set()
    pending: list[object] = [value]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Instance):
            if isinstance(item.factory, Global) and item.factory.name == class_name:
                yield item
            pending.extend((item.state, *item.args, *item.items.keys(), *item.items.values()))
            pending.extend(item.appended)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
