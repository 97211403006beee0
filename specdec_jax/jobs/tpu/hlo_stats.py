"""Counts read from a compiled program's optimised HLO text (``compiled.as_text()``).

XLA's Python API gives a compiled program's memory and cost totals but not what
the program is made of. The optimised HLO says that: how many kernels (fusions)
a step launches, which collectives a sharded program runs, whether anything
talks to the host inside a ``while`` loop (an infeed, outfeed, host send/recv or
a host callback there stalls every iteration), and how many asynchronous copies
(``copy-start``/``copy-done``, ``slice-start``/``slice-done``) the compiler
scheduled, with the bytes they move. Pure functions of the text; no JAX needed.

The HLO text format: computations (``%name (params) -> type {`` ... ``}``, one
marked ``ENTRY``), each a list of instructions
``[ROOT] %name = type opcode(operands), attribute=value, ...``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable

# Bytes per element of each HLO element type (sub-byte types as fractions).
ELEMENT_BYTES = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e3m4": 1, "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f4e2m1fn": 0.5, "f8e8m0fnu": 1,
}
HOST_OPCODES = ("infeed", "outfeed")
HOST_TRANSFER_OPCODES = ("send", "recv", "send-done", "recv-done")
# custom-call targets that run Python (or other host code) from a device program.
HOST_CALLBACK_MARKERS = ("callback", "host")
# Collectives, each counted once per operation: an async pair by its start.
COLLECTIVES = {
    "all-reduce": ("all-reduce", "all-reduce-start"),
    "all-gather": ("all-gather", "all-gather-start"),
    "reduce-scatter": ("reduce-scatter",),
    "all-to-all": ("all-to-all",),
    "collective-permute": ("collective-permute", "collective-permute-start"),
}
ASYNC_COPY_OPCODES = ("copy-start", "copy-done", "slice-start", "slice-done")

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY_TYPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
# One called computation (``body=%b``) or a braced list (``branch_computations={%a, %b}``):
# an unbraced name ends at the comma before the next attribute.
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|branch_computations|"
                     r"true_computation|false_computation)=(\{[^}]*\}|%?[\w.\-]+)")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# Where an instruction came from: older HLO text writes it in the metadata,
# newer text a stack frame id into the module's tables (``FileNames`` ...).
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_FRAME_ID = re.compile(r"\bstack_frame_id=(\d+)")
_OP_NAME = re.compile(r'\bop_name="([^"]*)"')
_TABLE_ROW = re.compile(r'^(\d+)\s+(?:"(.*)"|\{(.*)\})\s*$')
# Results that write no new buffer: views, tuples, a loop's or call's result
# (written by its body), constants (in the program's own memory).
NOT_WRITTEN = ("parameter", "get-tuple-element", "tuple", "bitcast", "while", "call",
               "conditional", "constant", "after-all", "opt-barrier", "copy-done",
               "slice-done", "add-dependency")
# In-place updates: the result is the operand's buffer with a slice written.
IN_PLACE = ("dynamic-update-slice", "scatter")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    type_text: str  # the result type, e.g. "bf16[8,128]{1,0}" or a tuple "(...)"
    rest: str  # operands and attributes, unparsed


@dataclasses.dataclass
class Module:
    """An HLO module: computations by name (instructions in order) and the entry's name."""

    computations: dict[str, list[Instruction]]
    entry: str | None


def _split_type(text: str) -> tuple[str, str]:
    """``"type opcode(...)..."`` -> (type, the rest), a tuple type's parentheses matched."""
    text = text.strip()
    if not text.startswith("("):
        head, _, rest = text.partition(" ")
        return head, rest
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text[:i + 1], text[i + 1:].strip()
    return text, ""


def parse(text: str) -> Module:
    """The computations of an HLO module's text (metadata blocks skipped)."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(2)
            computations[current] = []
            if header.group(1):
                entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        if current is None:
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        type_text, rest = _split_type(match.group(3))
        opcode = rest.split("(", 1)[0].strip()
        computations[current].append(Instruction(match.group(2), opcode, type_text, rest))
    return Module(computations, entry)


def called_computations(instruction: Instruction) -> list[tuple[str, str]]:
    """``(attribute, computation)`` pairs an instruction calls (``calls=``, ``body=``, ...)."""
    pairs = []
    for attribute, names in _CALLED.findall(instruction.rest):
        for name in names.strip("{}").split(","):
            name = name.strip().lstrip("%")
            if name:
                pairs.append((attribute, name))
    return pairs


def fused_computations(module: Module) -> set[str]:
    """Computations that are the body of a fusion (at any depth)."""
    return {name for instructions in module.computations.values() for ins in instructions
            if ins.opcode == "fusion" for attribute, name in called_computations(ins)
            if attribute == "calls"}


def loop_computations(module: Module) -> set[str]:
    """Computations run by a ``while`` loop: bodies, conditions and all they call."""
    roots = [name for instructions in module.computations.values() for ins in instructions
             if ins.opcode == "while" for attribute, name in called_computations(ins)
             if attribute in ("body", "condition")]
    seen: set[str] = set()
    while roots:
        name = roots.pop()
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        roots.extend(n for ins in module.computations[name] for _, n in called_computations(ins))
    return seen


def is_host_communication(instruction: Instruction) -> bool:
    """An infeed/outfeed, a send/recv to or from the host, or a host callback."""
    if instruction.opcode in HOST_OPCODES:
        return True
    if instruction.opcode in HOST_TRANSFER_OPCODES:
        return "is_host_transfer=true" in instruction.rest
    if instruction.opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]*)"', instruction.rest)
        return bool(target) and any(m in target.group(1).lower() for m in HOST_CALLBACK_MARKERS)
    return False


def type_bytes(type_text: str) -> int:
    """Bytes of every array in a (tuple) type, tiling padding not counted."""
    total = 0.0
    for element, dims, _ in _ARRAY_TYPE.findall(type_text):
        if element in ELEMENT_BYTES:
            total += ELEMENT_BYTES[element] * math.prod(int(d) for d in dims.split(",") if d)
    return int(total)


def memory_spaces(type_text: str) -> set[int]:
    """The memory spaces a type's layouts name (``S(n)``; none written: space 0, HBM)."""
    spaces = set()
    for _, _, layout in _ARRAY_TYPE.findall(type_text):
        found = _MEMORY_SPACE.search(layout or "")
        spaces.add(int(found.group(1)) if found else 0)
    return spaces


def tuple_elements(type_text: str) -> list[str]:
    """The top-level elements of a tuple type ``(a, (b, c), d)``."""
    inner, elements, depth, start = type_text.strip()[1:-1], [], 0, 0
    for i, char in enumerate(inner):
        depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            elements.append(inner[start:i].strip())
            start = i + 1
    elements.append(inner[start:].strip())
    return elements


def async_destination(instruction: Instruction) -> str:
    """The type an asynchronous copy writes: ``copy-start`` returns (destination,
    source, context), ``slice-start`` ((sources), destination, context)."""
    elements = tuple_elements(instruction.type_text)
    return elements[1] if instruction.opcode == "slice-start" else elements[0]


def _top_level(module: Module) -> Iterable[tuple[str, Instruction]]:
    fused = fused_computations(module)
    for name, instructions in module.computations.items():
        if name not in fused:
            for ins in instructions:
                yield name, ins


def summarize(text: str) -> dict:
    """The counts a compile report records for one program:

    - ``fusions``: fusion kernels outside fused computations (nested fusions are
      part of their kernel), in the entry and every loop body alike;
    - ``while_loops``; ``host_ops_in_loops`` / ``host_ops``: host communication
      inside any while loop / anywhere, as ``[opcode, name]`` lists;
    - ``collectives``: counts by kind (async pairs once);
    - ``async_copies``: counts of copy-start/done and slice-start/done, with
      ``copy_start_bytes`` (the arrays copied) and ``copy_start_to_space``
      (bytes copied by destination memory space: 0 is HBM, 1 on TPU on-chip
      memory);
    - ``custom_calls``: count.
    """
    module = parse(text)
    in_loops = loop_computations(module)
    counts = {"fusions": 0, "while_loops": 0, "custom_calls": 0}
    host_ops, host_in_loops = [], []
    collectives = dict.fromkeys(COLLECTIVES, 0)
    copies = dict.fromkeys(ASYNC_COPY_OPCODES, 0)
    copy_bytes, to_space = 0, {}
    for computation, ins in _top_level(module):
        if ins.opcode == "fusion":
            counts["fusions"] += 1
        elif ins.opcode == "while":
            counts["while_loops"] += 1
        elif ins.opcode == "custom-call":
            counts["custom_calls"] += 1
        if is_host_communication(ins):
            host_ops.append([ins.opcode, ins.name])
            if computation in in_loops:
                host_in_loops.append([ins.opcode, ins.name])
        for kind, opcodes in COLLECTIVES.items():
            collectives[kind] += ins.opcode in opcodes
        if ins.opcode in copies:
            copies[ins.opcode] += 1
        if ins.opcode in ("copy-start", "slice-start"):
            destination = async_destination(ins)
            size = type_bytes(destination)
            copy_bytes += size
            for space in memory_spaces(destination):
                to_space[str(space)] = to_space.get(str(space), 0) + size
    return {**counts, "host_ops": host_ops, "host_ops_in_loops": host_in_loops,
            "collectives": collectives, "async_copies": copies,
            "copy_start_bytes": copy_bytes, "copy_start_to_space": to_space}


def source_locations(text: str) -> dict[int, str]:
    """``{stack_frame_id: "file:line (function)"}`` from the module's stack-frame
    tables (newer HLO text); empty when the text has none."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
            continue
        row = _TABLE_ROW.match(line) if current is not None else None
        if row is None:
            current = None
            continue
        current[int(row.group(1))] = row.group(2) if row.group(2) is not None else row.group(3)

    def fields(entry: str) -> dict[str, str]:
        return dict(part.split("=", 1) for part in entry.split() if "=" in part)

    out = {}
    for frame, entry in tables.get("StackFrames", {}).items():
        location = fields(tables.get("FileLocations", {}).get(
            int(fields(entry).get("file_location_id", 0)), ""))
        file = tables.get("FileNames", {}).get(int(location.get("file_name_id", 0)))
        function = tables.get("FunctionNames", {}).get(
            int(location.get("function_name_id", 0)))
        if file:
            out[frame] = f"{file}:{location.get('line', '?')}" + (
                f" ({function})" if function else "")
    return out


def source_of(instruction: Instruction, frames: dict[int, str]) -> str | None:
    """``file:line`` an instruction's metadata names (or its stack frame's)."""
    found = _SOURCE.search(instruction.rest)
    if found:
        return f"{found.group(1)}:{found.group(2)}"
    frame = _FRAME_ID.search(instruction.rest)
    return frames.get(int(frame.group(1))) if frame else None


def _writes_in_place(module: Module, instruction: Instruction) -> bool:
    """A dynamic-update-slice or scatter, or a fusion whose root is one (or a
    tuple of them): it writes a slice into its operand's buffer."""
    if instruction.opcode in IN_PLACE:
        return True
    if instruction.opcode != "fusion":
        return False
    for attribute, name in called_computations(instruction):
        body = module.computations.get(name, []) if attribute == "calls" else []
        root = body[-1] if body else None  # the text lists a computation's ROOT last
        if root is None:
            return False
        if root.opcode in IN_PLACE:
            return True
        if root.opcode == "tuple":
            by_name = {ins.name: ins for ins in body}
            parts = re.findall(r"%([\w.\-]+)", root.rest.split(")", 1)[0])
            return bool(parts) and all(
                by_name[p].opcode in IN_PLACE for p in parts if p in by_name)
    return False


def loop_values(text: str, min_bytes: float) -> list[dict]:
    """Arrays of at least ``min_bytes`` that a ``while`` loop writes on every
    iteration: results of the instructions of loop bodies and conditions and the
    (unfused) computations they call, fusion kernels included by their outputs
    only (a value inside a fusion stays in registers or on-chip memory; it is
    never written to HBM). Views, tuples, loop and call results, constants and
    in-place slice updates (``NOT_WRITTEN``, ``IN_PLACE``) write no new buffer;
    arrays in on-chip memory (``S(1)``: a TPU prefetching a weight's tiles for
    the kernel that reads it) take no HBM and are left out.

    Each: ``{"bytes", "type", "opcode", "name", "op_name", "source", "loop",
    "loop_depth"}``: ``loop`` is the innermost ``while`` that runs it (written
    once per iteration of it) and ``loop_depth`` how many loops enclose it.
    Largest first (then by name). Weight-sized values here are weights copied, converted or
    re-laid out every iteration (issue 55).
    """
    module = parse(text)
    fused = fused_computations(module)
    frames = source_locations(text)
    # Computation -> (innermost while, depth): walk from the entry down.
    where: dict[str, tuple[str | None, int]] = {}
    stack = [(module.entry, None, 0)] if module.entry else []
    while stack:
        name, loop, depth = stack.pop()
        if name in where or name not in module.computations or name in fused:
            continue
        where[name] = (loop, depth)
        for ins in module.computations[name]:
            for attribute, called in called_computations(ins):
                if ins.opcode == "while" and attribute in ("body", "condition"):
                    stack.append((called, ins.name, depth + 1))
                elif attribute != "calls" or ins.opcode != "fusion":
                    stack.append((called, loop, depth))
    out = []
    for name, (loop, depth) in where.items():
        if loop is None:
            continue
        for ins in module.computations[name]:
            if ins.opcode in NOT_WRITTEN or _writes_in_place(module, ins):
                continue
            written = ins.type_text
            if ins.opcode in ("copy-start", "slice-start"):
                written = async_destination(ins)
            size = type_bytes(written)
            if size < min_bytes or memory_spaces(written) != {0}:
                continue  # small, or in on-chip memory (a TPU's weight prefetch, S(1))
            op_name = _OP_NAME.search(ins.rest)
            out.append({"bytes": size, "type": re.sub(r"\{[^{}]*\}", "", written),
                        "opcode": ins.opcode, "name": ins.name,
                        "op_name": op_name.group(1) if op_name else None,
                        "source": source_of(ins, frames), "loop": loop, "loop_depth": depth})
    return sorted(out, key=lambda v: (-v["bytes"], v["name"]))


_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+), (.*):\s*$")
_VALUE = re.compile(r"^\s*value: <\d+ ([\w.\-]+)(\{[^}]*\})? @(\d+)> "
                    r"\(size=(\d+),offset=(\d+)\): (.*)$")


def hbm_temporaries(assignment: str) -> dict:
    """``{"bytes", "small_values", "small_span_bytes"}`` of a buffer
    assignment's HBM (memory space 0) temporaries: the allocations that hold
    no parameter, constant or output, thread-local ones included.
    ``memory_analysis().temp_size_in_bytes`` is not this on a TPU: it exceeds
    it by 40-120 MB for the Qwen pair's generate programs on v5e, memory that
    no HBM allocation of the assignment holds. ``small_values``: values of at
    most 4 KiB (a prefetch's async-copy descriptors, tuples) above the last
    larger value of the largest allocation, and ``small_span_bytes`` the span they
    take: the TPU compiler gives each its own 16 KiB-aligned slot, so a
    program with more prefetched calls holds more of them."""
    sizes, allocation, values = {}, None, {}
    for line in assignment.splitlines():
        head = _ALLOCATION.match(line)
        if head:
            allocation = None
            if not re.search(r"\bcolor [1-9]|parameter|constant|output|live-out",
                             head.group(3)):
                allocation = head.group(1)
                sizes[allocation] = int(head.group(2))
            continue
        value = _VALUE.match(line) if allocation is not None else None
        if value is not None and value.group(3) == "0":
            values.setdefault(allocation, []).append((int(value.group(5)), int(value.group(4))))
    # The small values of the largest allocation (the program's preallocated temporaries).
    here = values.get(max(sizes, key=sizes.get), []) if sizes else []
    large_end = max((o + s for o, s in here if s > 4096), default=0)
    above = [(o, s) for o, s in here if o >= large_end]
    return {"bytes": sum(sizes.values()), "small_values": len(above),
            "small_span_bytes": max((o + s for o, s in above), default=large_end) - large_end}


def temp_buffers(assignment: str, text: str, top: int = 8) -> list[dict]:
    """The largest values behind a program's HBM temporaries, read from the
    compiler's buffer assignment (``assignment``: the
    ``*after_optimizations-buffer-assignment.txt`` an ``xla_dump_to`` compile
    writes; ``text``: the compiled HLO, for the values' sources). Temporaries
    are the allocations of memory space 0 (HBM) that hold no parameter,
    constant or output; values in one allocation share it over their lifetimes,
    so their sizes do not add up to the allocation's.

    Each: ``{"bytes", "type", "name", "opcode", "op_name", "source"}``, largest
    first, each value once."""
    module = parse(text)
    instructions = {ins.name: ins for body in module.computations.values() for ins in body}
    frames = source_locations(text)
    found: dict[str, dict] = {}
    temporary = False
    for line in assignment.splitlines():
        allocation = _ALLOCATION.match(line)
        if allocation:
            attributes = allocation.group(3)
            temporary = not re.search(
                r"\bcolor [1-9]|parameter|constant|output|live-out|thread-local", attributes)
            continue
        value = _VALUE.match(line) if temporary else None
        if value is None or value.group(3) != "0":
            continue
        name, size = value.group(1), int(value.group(4))
        if name in found and found[name]["bytes"] >= size:
            continue
        ins = instructions.get(name)
        op_name = _OP_NAME.search(ins.rest) if ins else None
        found[name] = {"bytes": size, "type": re.sub(r"\{[^{}]*\}", "", value.group(6)),
                       "name": name, "opcode": ins.opcode if ins else None,
                       "op_name": op_name.group(1) if op_name else None,
                       "source": source_of(ins, frames) if ins else None}
    return sorted(found.values(), key=lambda v: (-v["bytes"], v["name"]))[:top]
