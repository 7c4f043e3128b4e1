"""The text forms of a rendered plan (pure): ``--print-env``'s shell and dotenv lines and
other stacks' bind strings, the plan as JSON, the dry run's commands, and the text helpers
they share (:func:`one_line`, :func:`json_text`, :func:`command_text`). Strings are made
here, from the typed :class:`cpulaunch.render.Rendered`; nothing here decides a value.
"""

from __future__ import annotations

from cpulaunch import cpulist, envvars
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:  # the types only: render imports this module's helpers
    from typing import Any, Mapping, Optional, Sequence
    from cpulaunch.render import Rendered, RenderedInstance

__all__ = [
    "quote",
    "join",
    "RUN_FUNCTION",
    "EVAL_FAILS",
    "TEXT_WIDTH",
    "binding_prefix",
    "shell_exports",
    "dotenv_lines",
    "omp_bind_string",
    "bind_lines",
    "instance_dict",
    "plan_json",
    "json_text",
    "one_line",
    "command_text",
    "dry_run_text",
]


#: The characters a word may hold and stay unquoted: :func:`shlex.quote`'s (``[\w@%+=:,./-]``
#: in ASCII).
_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-"


def quote(word: str) -> str:
    """``word`` as one word of a POSIX shell command line: :func:`shlex.quote`'s rule (as
    it is, unless it holds a character outside ``[A-Za-z0-9_@%+=:,./-]`` or is empty; then
    single-quoted, each ``'`` written ``'"'"'``), without importing :mod:`shlex`, which
    imports :mod:`re` (issue 40: milliseconds of every dry run). ``tests/test_regex_twins.py``
    holds the two equal. ``"a b"`` -> ``"'a b'"``; ``"x.py"`` -> ``"x.py"``; ``""`` -> ``"''"``."""
    if not word:
        return "''"
    if not word.strip(_SAFE):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def join(words: Sequence[str]) -> str:
    """The words quoted by :func:`quote` and joined by spaces (:func:`shlex.join`'s rule)."""
    return " ".join(quote(w) for w in words)


def binding_prefix(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> tuple[str, ...]:
    """The command to put in front of the program for a shell script: the numactl prefix,
    or with ``bind="affinity"`` ``taskset -c <cpus>`` (taskset(1)); empty when unbound."""
    if inst.prefix:
        return tuple(inst.prefix)
    if inst.affinity is not None and taskset:
        return (taskset, "-c", cpulist.format(inst.affinity))
    return ()


def _print_prefix(inst: RenderedInstance, taskset: Optional[str]) -> str:
    return join(binding_prefix(inst, taskset))


#: The shell function --print-env defines: the program runs under the instance's binding,
#: with no word splitting of $CPULAUNCH_PREFIX (zsh does none): ``cpulaunch_run python x.py``.
RUN_FUNCTION = "cpulaunch_run"
#: What --print-env prints instead of an environment when cpulaunch fails: evaluated, it
#: fails (exit status 1), so ``set -e`` stops and ``eval "$(...)" || exit`` exits, in bash,
#: zsh and dash alike, rather than running the program unbound.
EVAL_FAILS = "false\n"


def shell_exports(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> str:
    """POSIX ``export NAME='value'`` lines, safe to ``eval`` whatever the values hold
    (values that need it quoted by :func:`quote`), every planned variable included: one the
    user exported and cpulaunch keeps is exported with the kept value after a ``:`` line
    saying so (``:`` is the comment every shell parses, zsh's interactive eval included).
    Then ``CPULAUNCH_PREFIX``, the binding command, and the function :data:`RUN_FUNCTION`
    that runs its arguments under it (``cpulaunch_run python x.py``; no word splitting)."""
    lines = []
    for k, v in _with_kept(inst).items():
        if k in inst.kept:
            lines.append(": " + quote(_kept_text(k, inst.kept[k])))
        lines.append(f"export {k}={quote(v)}")
    prefix = binding_prefix(inst, taskset)
    lines.append(f"export CPULAUNCH_PREFIX={quote(join(prefix))}")
    lines.append(f"{RUN_FUNCTION}() {{ {join(prefix) + ' ' if prefix else ''}\"$@\"; }}")
    return "\n".join(lines) + "\n"


def dotenv_lines(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> str:
    """``NAME='value'`` lines for POSIX sh's ``set -a; . ./FILE; set +a`` (the target this
    format is written for: values that need it single-quoted by :func:`quote`, so ``$``,
    backticks, backslashes and newlines come back exactly as they are), every planned
    variable included (a kept one with its kept value, after a ``#`` comment line)."""
    out = []
    for k, v in {**_with_kept(inst), envvars.PREFIX: _print_prefix(inst, taskset)}.items():
        if k in inst.kept:
            out.append("# " + one_line(_kept_text(k, inst.kept[k])) + "\n")
        out.append(f"{k}={quote(v)}\n")
    return "".join(out)


def _with_kept(inst: RenderedInstance) -> dict:
    """The instance's variables with the kept ones at their kept values, sorted."""
    return dict(sorted({**inst.env, **{k: user for k, (user, _) in inst.kept.items()}}.items()))


def _kept_text(name: str, values: tuple) -> str:
    user, planned = values
    return f"{name}: your value kept (cpulaunch planned {planned}; --override-env uses it)"


def omp_bind_string(rendered: "Rendered") -> str:
    """The instances' compute cpulists joined by ``|`` (``0-31|32-63``): the format of
    vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` and SGLang's ``SGLANG_CPU_OMP_THREADS_BIND``
    (one entry per tensor-parallel rank, in rank order)."""
    return "|".join(cpulist.format(i.cpus) for i in rendered.instances)


def bind_lines(rendered: "Rendered", stack: str) -> str:
    """Assignment lines for another serving stack (``--print-env --format vllm|sglang``).

    vLLM (CPU backend; vllm/envs.py): ``VLLM_CPU_OMP_THREADS_BIND`` (its
    ``VLLM_CPU_NUM_OF_RESERVED_CPU`` applies only to ``auto`` binding, so it is not
    printed with explicit lists). SGLang (CPU backend): ``SGLANG_CPU_OMP_THREADS_BIND``.
    Values are shell-quoted; docs/guide/integrations.md has the versions checked.
    """
    bind = omp_bind_string(rendered)
    if stack == "vllm":
        lines = [f"VLLM_CPU_OMP_THREADS_BIND={quote(bind)}"]
    elif stack == "sglang":
        lines = [f"SGLANG_CPU_OMP_THREADS_BIND={quote(bind)}"]
    else:
        raise ValueError(stack)
    return "\n".join(lines) + "\n"


def instance_dict(inst: RenderedInstance) -> dict[str, Any]:
    """One instance in the JSON schema of docs/reference/plan-json.md."""
    return {
        "index": inst.index,
        "cpus": list(inst.cpus),
        "cpulist": cpulist.format(inst.cpus),
        "bound_cpus": list(inst.bound_cpus),
        "mem_nodes": list(inst.mem_nodes),
        "mem_policy": inst.mem_policy,
        "env": dict(inst.env),
        "argv": list(inst.argv),
        **({"kept": {k: {"yours": u, "planned": p} for k, (u, p) in inst.kept.items()}} if inst.kept else {}),
    }


def plan_json(rendered: Rendered, topology: dict[str, Any], extra: Optional[dict[str, Any]] = None) -> str:
    """``--dry-run --format json``: ``{"instances": [...], "notes": [...], "topology": {...}}``,
    laid out by :func:`json_text`."""
    doc = {
        "instances": [instance_dict(i) for i in rendered.instances],
        "num_instances": rendered.num_instances,
        "notes": list(rendered.notes),
        "topology": topology,
    }
    if rendered.recipe is not None:
        doc["recipe"] = rendered.recipe.to_dict()
    if extra:
        doc.update(extra)
    return json_text(doc)


def json_text(doc) -> str:
    """``doc`` (JSON-ready dicts, lists and scalars) as JSON laid out for reading, no final
    newline: every member of an object and every record of a list of records on its own
    line, indented by two spaces; a value that holds no object or list of them (a number, a
    string, a list of CPU ids, a flat record such as one core) on one line. A list whose
    first item is such a flat record is taken to be a list of records, one a line::

        {
          "instances": [
            {
              "index": 0,
              "cpus": [0, 1, 2, 3],
              "env": {"OMP_NUM_THREADS": "4"}
            }
          ],
          "topology": {
            "cores": [
              {"id": 0, "cpus": [0, 4], "socket": 0, "node": 0, "efficiency": false},

    Each one-line value is written by the json module's C encoder (``indent=2`` uses its
    pure-Python one): 100 KB of plan on 1,024 CPUs take a fifth of the time and half the
    bytes (issue 12). Any JSON parser reads the same document as ``json.dumps(doc)``.
    """
    import json  # only the JSON outputs need it (issue 12: 2 ms of start-up)

    return _laid_out(doc, "", json.JSONEncoder().encode)


_NESTED = (dict, list)


def _laid_out(value, pad: str, encode) -> str:
    if type(value) is dict:
        if _holds_nested(value):
            inner = pad + "  "
            return "{\n" + ",\n".join(f"{inner}{encode(k)}: {_laid_out(v, inner, encode)}"
                                      for k, v in value.items()) + f"\n{pad}}}"
    elif type(value) is list and value and type(value[0]) in _NESTED:
        inner = pad + "  "
        if type(value[0]) is dict and not _holds_nested(value[0]):  # records: one a line
            return "[\n" + inner + f",\n{inner}".join(map(encode, value)) + f"\n{pad}]"
        return "[\n" + ",\n".join(inner + _laid_out(v, inner, encode) for v in value) + f"\n{pad}]"
    return encode(value)


def _holds_nested(record: dict) -> bool:
    return any(type(v) is dict or (type(v) is list and v and type(v[0]) in _NESTED)
               for v in record.values())


def one_line(text: str) -> str:
    """``text`` with every control character (newline, carriage return, escape, ...)
    written as a backslash escape, so a value the user set can never start a new line in
    a ``# note:`` comment, a log line or a terminal: ``"1\\ntouch x"`` -> ``"1\\\\ntouch x"``."""
    out = []
    for ch in text:
        o = ord(ch)
        if o < 32 or o == 127 or 0x80 <= o < 0xA0 or ch in "\u2028\u2029":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


#: Columns of a dry run's command lines: longer commands continue on the next line after a
#: backslash, as a person writes them (a word is never cut).
TEXT_WIDTH = 100


def command_text(env: Mapping[str, str], argv: Sequence[str], width: Optional[int] = None) -> str:
    """One shell command that runs ``argv`` with ``env`` added: ``env NAME=VALUE ... prog
    args``, every word quoted (:func:`quote`). A program whose name holds ``=`` would be read
    by env(1) as one more assignment, so it is run through ``sh -c 'exec "$0" "$@"'``.

    ``width``: continue the command on new lines (a backslash, then two spaces) so that each
    line holds at most ``width`` columns where its words allow; the program starts a line
    of its own. None: one line."""
    words = ["env"] + [f"{k}={v}" for k, v in env.items()]
    argv = list(argv)
    if argv and "=" in argv[0]:
        words += ["sh", "-c", 'exec "$0" "$@"']
    if width is None:
        return " ".join(quote(w) for w in words + argv)
    return " \\\n".join(_fill([quote(w) for w in words], width)
                         + _fill([quote(w) for w in argv], width, "  "))


def _fill(words: list, width: int, first: str = "") -> list:
    """``words`` in lines of at most ``width`` columns (a longer word alone), the first line
    starting with ``first``, the others with two spaces."""
    lines, line = [], first
    for w in words:
        if line.strip() and len(line) + 1 + len(w) + 2 > width:
            lines.append(line)
            line = "  "
        line += ("" if not line.strip() else " ") + w
    if line.strip():
        lines.append(line)
    return lines


def dry_run_text(rendered: Rendered) -> str:
    """Human-readable dry run: each instance's command and the env it changes, then notes.

    Safe to paste or pipe to ``sh`` whatever the values hold: comments hold only
    :func:`one_line` text, and commands only shell-quoted words.
    """
    lines = []
    for inst in rendered.instances:
        extra = set(inst.bound_cpus) - set(inst.cpus)
        head = (f"# {inst.label or 'instance %d' % inst.index}: cpus {cpulist.format(inst.cpus)}"
                + (f" (+ helpers {cpulist.format(extra)})" if extra else "")
                + (f", memory {inst.mem_policy} {cpulist.format(inst.mem_nodes)}" if inst.mem_nodes else "")
                + (f", affinity {cpulist.format(inst.affinity)}" if inst.affinity else ""))
        lines.append(one_line(head))
        lines.append(command_text(inst.env, inst.argv, TEXT_WIDTH))
    if rendered.recipe is not None and rendered.recipe.env:  # a recipe that sets nothing: JSON says it
        lines.append(f"# {one_line(rendered.recipe.line)}")
    for note in rendered.notes:
        lines.append(f"# note: {one_line(note)}")
    return "\n".join(lines) + "\n"
