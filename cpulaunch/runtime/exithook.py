"""End the default process group before the interpreter finalizes, when the program did not.

Why (issue 24 item 8, pytorch#190489): a rank whose program never calls
``torch.distributed.destroy_process_group()`` (Lightning's DDP strategy does not, nor does
accelerate's ``PartialState``) sometimes dies after its last step with "terminate called
without an active exception" (SIGABRT, exit 134). Read from the core dumps of such ranks
here (torch 2.13, Python 3.11): a gloo worker thread drops its last reference to a finished
collective (``ProcessGroupGloo::runLoop`` -> ``~AsyncWork``); the work's tensors have Python
objects, so the release takes the GIL (``TensorImpl::decref_pyobject``); when that happens
after the main thread has begun to finalize the interpreter, CPython ends the thread
(``PyThread_exit_thread``) by unwinding it through a ``noexcept`` destructor, and the C++
runtime calls ``std::terminate()``. It is a race lost rarely (the release follows the
collective by microseconds), more often on a loaded machine. Destroying the process group
while the interpreter is fully alive closes the window: ``~ProcessGroupGloo`` releases the
GIL, lets the workers finish and drop their work, and joins them.

torch's own fix (an atexit handler in init_process_group, pytorch#179291) was abandoned;
Lightning registers the same handler for NCCL only. This module is the launcher's version:

- :func:`install` registers :func:`end_process_group` with ``atexit`` once. Registered at
  start-up (cpulaunch's ``sitecustomize`` for the ranks it starts) it runs after every exit
  handler the program registers itself; registered by
  :func:`cpulaunch.distributed.init_process_group` it runs before those registered earlier.
- :func:`end_process_group` destroys the default group only when it is there, was made in
  this process (not inherited through ``fork``) and the program did not end with an uncaught
  exception: a rank that fails while others wait in a collective must not wait for them in
  its exit (torchtitan's ``destroy_process_group`` hang, pytorch/torchtitan#1342); it exits
  as it did before. A program that ends with ``sys.exit(N)`` cannot be told from one that
  ended well (atexit does not see the code), so its group is destroyed as torch documents
  for a normal end.
- Then, in the same cases, it runs ``gc.collect()`` (issue 25): a program that *did* call
  ``destroy_process_group()`` still aborted the same way, 4 times in 50 runs of
  examples/article_ddp.py on 2 gloo ranks here, because its ``DistributedDataParallel``
  model sits in a reference cycle (its hooks refer back to it) and holds the gloo group and
  the last collectives' work; only the collector frees them, and without this call it does so
  while the interpreter finalizes. Collected at exit, 0 aborts in 70 runs.

Only the standard library is imported here, and torch only if the program imported it: the
module is loaded by file path in every Python process a rank starts, whatever its
interpreter.
"""

import atexit
import gc
import os
import sys

__all__ = ["end_process_group", "install"]

#: This module's state: installed once per process; the group a forked child inherited.
_STATE = {"installed": False, "inherited": None}


def _default_group():
    """The default process group object, or None (torch.distributed not imported, not
    initialised, or unavailable). Never imports torch."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return None
    try:
        return c10d.GroupMember.WORLD
    except AttributeError:
        return None


def _forked_child() -> None:
    """``os.register_at_fork`` hook: the child's copy of the parent's group has no worker
    threads; it is the parent's to end, not the child's."""
    _STATE["inherited"] = _default_group()


def install() -> bool:
    """Register :func:`end_process_group` to run at exit (once per process: later calls,
    and calls on another copy of this module once the site hook's copy,
    ``sys.modules["_cpulaunch_exithook"]``, is installed, do nothing). Returns True when
    this call registered it."""
    if _STATE["installed"]:
        return False
    other = sys.modules.get("_cpulaunch_exithook")  # the copy cpulaunch's site hook loaded at start-up
    if other is not None and other is not sys.modules.get(__name__) and getattr(other, "_STATE", {}).get("installed"):
        return False
    _STATE["installed"] = True
    atexit.register(end_process_group)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forked_child)
    return True


def end_process_group() -> bool:
    """Destroy torch.distributed's default process group (and so every group) if the program
    left it alive, then collect garbage; returns True when it destroyed the group.

    Does nothing when torch.distributed was never imported, when the default group was
    inherited through ``fork`` (a DataLoader worker's copy: the parent's to end), or when
    the program ends with an uncaught exception (``sys.last_value``/``sys.last_exc`` is set
    before exit handlers run): a failing rank's
    groups may have collectives stuck waiting for peers, which destroying them would wait
    for. Otherwise the group, when there is one, is destroyed, and ``gc.collect()`` releases
    the groups and collectives only a reference cycle still held (module doc). An error from
    torch is reported on stderr in one line; the exit code stays the program's.
    """
    group = _default_group()
    if "torch.distributed.distributed_c10d" not in sys.modules:
        return False
    if group is not None and group is _STATE["inherited"]:
        return False
    if getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None:
        return False
    ended = False
    if group is not None:
        try:
            sys.modules["torch.distributed"].destroy_process_group()
            ended = True
        except Exception as exc:  # noqa: BLE001 (torch's error, whatever it is; the program's own result stands)
            sys.stderr.write(f"cpulaunch: could not end the process group at exit: {exc}\n")
    gc.collect()
    return ended
