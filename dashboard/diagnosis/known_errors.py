"""Known error texts: the catalogue of gloo, TCPStore, rendezvous and NCCL errors pgdash recognises.

Each rule is one entry: a regex, a stable cause id, a title, whether this rank is usually a
*victim* (it waited on a peer that crashed, hung or never arrived) rather than the culprit, and a
hint template filled from the regex's named groups. Rules are tried in order and the first match
wins, so more specific texts come first (an NCCL watchdog timeout also contains "timeout"; a
desync report that names the lagging rank beats the timeout it explains). ``EXTRACTORS`` are the
patterns of values read from anywhere in a text, whichever rule matched.

The patterns were written against torch 2.13 texts (``shared/notes/torch-2.13-facts.md`` §4) and
the NCCL variants quoted there from older releases; they skip the build paths and line numbers
that vary between builds (``[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]``).

This is its own room because it is data that grows one entry per newly seen text, while the way
a text is matched, its values typed and a hint filled (dashboard.diagnosis.errors) rarely changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One known error text. ``title`` and ``hint`` are ``str.format`` templates whose fields are
    the pattern's named groups (or values derived from them, see ``_DERIVED`` in
    dashboard.diagnosis.errors)."""

    pattern: re.Pattern[str]
    cause: str
    title: str
    victim: bool
    hint: str
    # The text after the match holds the error that the one matched wraps (another rank's, a
    # library's): where a rule knows that one, its title and hint lead.
    wraps: bool = False


def _rule(pattern: str, cause: str, title: str, victim: bool, hint: str,
          wraps: bool = False) -> Rule:
    return Rule(re.compile(pattern, re.IGNORECASE), cause, title, victim, hint, wraps)


_RANKS = r"\d+(?:,\s*\d+)*"  # "7" or "0, 1, 2" as printed by c10d's ranksToString
_SHM = ("In a container give it more (`docker run --shm-size=16g` or `--ipc=host`; "
        "Kubernetes: an `emptyDir` with `medium: Memory` mounted at `/dev/shm`); check with "
        "`df -h /dev/shm`.")
_UNUSED = ("of this rank's model got no gradient in its last step (a branch of `forward` only "
           "this rank took, or an output left out of the loss), so DDP never reduced them. "
           "Make every rank use every parameter, or pass `find_unused_parameters=True` to DDP "
           "(slower); `TORCH_DISTRIBUTED_DEBUG=DETAIL` names them.")
_DISK = ("Check `df -h` and `df -i` on this host for the directory it wrote, free space or "
         "point the writes elsewhere, and keep fewer checkpoints (a checkpoint is written "
         "whole before the old one is deleted, so it needs room for both).")
_MODEL = ("one rank built it from another config, flag or branch on its rank in `__init__`. "
          "Print `[p.shape for p in model.parameters()]` on each rank before wrapping it in DDP "
          "and make them agree.")
_FR = ("`TORCH_NCCL_DUMP_ON_TIMEOUT=1` with `TORCH_FR_BUFFER_SIZE=2000` (older releases: "
       "`TORCH_NCCL_TRACE_BUFFER_SIZE`) for a Flight Recorder dump")

# Most specific first. Within NCCL: this rank's own GPU/usage errors, then reports that name the
# lagging rank, then plain timeouts. Then rendezvous/config errors (root causes), then the
# transport errors a victim sees.
RULES: tuple[Rule, ...] = (
    # --- NCCL: this rank's own failures -------------------------------------------------------
    _rule(r"ncclUnhandledCudaError|unhandled cuda error",
          "nccl_cuda_error", "NCCL hit a CUDA error on this rank's GPU", False,
          "A CUDA call inside NCCL failed on this rank's GPU: check `nvidia-smi -q -d "
          "ECC,PAGE_RETIREMENT` and Xid lines in `dmesg -T | grep -i xid` on this host, and rerun "
          "with `NCCL_DEBUG=INFO` to see the failing call. An earlier error in your own kernels "
          "(illegal memory access, device-side assert) also surfaces here: `CUDA_LAUNCH_BLOCKING=1` "
          "pins it down."),
    _rule(r"Duplicate GPU detected\s*:\s*(?P<ranks>rank \d+ and rank \d+) both on CUDA device "
          r"(?P<device>\w+)",
          "nccl_invalid_usage", "two ranks share one GPU", False,
          "Ranks {ranks} both use CUDA device {device}: call `torch.cuda.set_device(local_rank)` "
          "(LOCAL_RANK from torchrun) before `init_process_group`, and check that "
          "CUDA_VISIBLE_DEVICES gives each rank on that host its own GPU."),
    _rule(r"ncclInvalidUsage|NCCL error[^\n]{0,300}?\binvalid usage\b|\binvalid usage \(run with NCCL_DEBUG",
          "nccl_invalid_usage", "NCCL rejected a call as invalid usage", False,
          "NCCL says this rank used it wrongly, most often two ranks on one GPU (call "
          "`torch.cuda.set_device(local_rank)` before `init_process_group`, check "
          "CUDA_VISIBLE_DEVICES) or communicators set up differently across ranks. Rerun with "
          "`NCCL_DEBUG=WARN` for the exact reason."),
    _rule(r"ncclSystemError|unhandled system error",
          "nccl_system_error", "NCCL hit a system error (sockets, InfiniBand or shared memory)", False,
          "A system call or external library inside NCCL failed on this rank: rerun with "
          "`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET` and read the `NCCL WARN` line. In "
          "containers check the `/dev/shm` size (`df -h /dev/shm`, docker `--shm-size`), and set "
          "`NCCL_SOCKET_IFNAME` to the interface the hosts reach each other on."),
    _rule(r"CUDA out of memory",
          "cuda_oom", "this rank ran out of GPU memory", False,
          "This rank's GPU ran out of memory; its peers then fail waiting for it. Lower the batch "
          "size or activation memory on this rank, and try "
          "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` if the message shows much memory "
          "reserved but unallocated."),
    # --- DataLoader: a worker process of this rank died (its own error, not the code's line) ---
    _rule(r"DataLoader worker \(pid (?P<worker>\d+)\) is killed by signal: Bus error"
          r"|Unexpected bus error encountered in worker",
          "dataloader_shm", "a DataLoader worker hit a bus error (shared memory full)", False,
          "A DataLoader worker of this rank died of a bus error: workers hand batches over in "
          "shared memory (`/dev/shm`), and it was full. " + _SHM + " Fewer workers or a "
          "smaller `prefetch_factor` need less."),
    _rule(r"DataLoader worker \(pid (?P<worker>\d+)\) is killed by signal: Killed",
          "dataloader_killed", "a DataLoader worker was killed (SIGKILL: the OOM killer)", False,
          "A DataLoader worker of this rank (pid {worker}) got SIGKILL, almost always from the "
          "kernel's OOM killer: `dmesg -T | grep -iE 'killed process|out of memory'` on this "
          "host shows it. Each worker holds its own copy of the dataset and prefetches "
          "`prefetch_factor` batches: lower `num_workers` or `prefetch_factor`, and keep big "
          "tables in numpy arrays, not Python lists, which every worker ends up copying."),
    _rule(r"DataLoader worker \(pid\(?s?\)? (?P<worker>[\d, ]+)\) (?:is killed by signal: "
          r"(?P<signal>[^.\n]{1,40})|exited unexpectedly)",
          "dataloader_worker_died", "a DataLoader worker process died", False,
          "A DataLoader worker of this rank (pid {worker}) died, so its batch never came: the "
          "cause is in the worker, not on the line the traceback ends at. Read this rank's log "
          "above the traceback for the worker's own error (a segmentation fault in a decoding "
          "library, an exception in the dataset's `__getitem__`), check `dmesg -T` on this host "
          "for an OOM kill, and rerun with `num_workers=0` to see the error in the main "
          "process."),
    _rule(r"unable to (?:write to file </torch_|allocate shared memory)",
          "dataloader_shm", "shared memory (/dev/shm) is full", False,
          "This rank could not put a tensor in shared memory (`/dev/shm`), which DataLoader "
          "workers use to hand batches over, because it is full. " + _SHM),
    # --- torch.distributed.checkpoint: every rank raises the failure of the ranks it names ---
    _rule(r"CheckpointException ranks:dict_keys\(\[(?P<ranks>[\d, ]*)\]\)",
          "checkpoint_failed", "dcp raised the failure of rank(s) {ranks} on every rank",
          False,
          "dcp.save (or dcp.load) gathers each rank's failure and raises it on every rank as "
          "CheckpointException: the failure is that of rank(s) {ranks}, whose own error and "
          "traceback follow the first line of this text; on the other ranks it is an echo.",
          wraps=True),
    # --- the environment: a module one host lacks (every rank: a wrong name, or never installed)
    _rule(r"No module named '(?P<module>[\w.]{1,200})'",
          "module_missing", "Python could not import {module} on this rank", False,
          "`import {module}` failed on this rank. If the other ranks got past it, this host's "
          "environment differs from theirs (another virtualenv or container image, a package "
          "installed by hand on some nodes): compare `pip list` there with a host where it "
          "worked, and launch every rank with the same interpreter. If every rank raised it, "
          "the name is wrong or the package was never installed (`pip install` it)."),
    # --- a write this rank made failed: a full disk, not a bug of the line that wrote ---------
    # (after the /dev/shm text above, which also ends in "No space left on device")
    _rule(r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]",
          "disk_full", "a write failed: the disk (or the quota) is full", False,
          "A file this rank wrote (a checkpoint, a log, a cache) hit a full disk or the user's "
          "quota. " + _DISK),
    _rule(r"PytorchStreamWriter failed writing file (?P<file>\S+?):? file write failed"
          r"|\bunexpected pos \d+ vs \d+",
          "disk_full", "torch.save could not finish writing its file (a full disk?)", False,
          "torch.save stopped part-way through its file: almost always a full disk or quota "
          "(or a file system that went away, such as a dropped network mount). " + _DISK),
    _rule(r"CUDA error: (?P<what>[^\n]{1,200}?)\s*(?:\n|$)",
          "cuda_error", "a CUDA error on this rank's GPU ({what})", False,
          "CUDA reports a failed kernel at a later call, so the line in the traceback may not be "
          "the one that failed: rerun this rank with `CUDA_LAUNCH_BLOCKING=1` to see the kernel. "
          "A device-side assert is most often an index out of range (embedding ids, a loss's "
          "class targets); an illegal memory access can also be a faulty GPU "
          "(`dmesg -T | grep -i xid` on this host)."),
    # --- NCCL: reports that name the rank at fault ----------------------------------------------
    _rule(r"ranks \[(?P<peers>" + _RANKS + r")\] are the lagging ranks that caused this timeout",
          "nccl_watchdog_timeout", "NCCL collective timed out; rank(s) {peers} never joined any collective",
          True,
          "The desync report names rank(s) {peers} as never having joined a collective on this "
          "group: read their logs first (crash before the first collective, OOM-killed, stuck in "
          "data loading). This rank only waited for them."),
    _rule(r"\[(?P<peers>" + _RANKS + r")\] joined but didn't finish collective #(?P<seq>\d+)",
          "nccl_watchdog_timeout", "NCCL collective timed out; rank(s) {peers} stuck inside collective #{seq}",
          True,
          "The desync report says rank(s) {peers} entered collective #{seq} but never finished it: "
          "they are stuck inside NCCL (a hung GPU, link or peer). Check `py-spy dump --native "
          "--pid <pid>` on them and `dmesg -T | grep -i xid` on their hosts."),
    _rule(r"\[(?P<peers>" + _RANKS + r")\] finished collective #(?P<last_finished>\d+), but didn't "
          r"join collective #(?P<seq>\d+)",
          "nccl_watchdog_timeout", "NCCL collective timed out; rank(s) {peers} never entered collective #{seq}",
          True,
          "The desync report says rank(s) {peers} finished collective #{last_finished} but never "
          "entered #{seq}: they are stuck or took another code path before it (a data-dependent "
          "branch, a swallowed exception, a slow dataloader). `py-spy dump --pid <pid>` on them "
          "shows where."),
    _rule(r"Ranks? (?P<peers>" + _RANKS + r") failed to pass monitoredBarrier in (?P<timeout_ms>\d+)\s*ms",
          "monitored_barrier_timeout", "rank(s) {peers} did not reach the monitored barrier", True,
          "Rank(s) {peers} did not reach the monitored barrier within {timeout_ms} ms: read their "
          "logs first (crashed, hung, or on another code path); this rank only waited for them."),
    _rule(r"Rank \d+ successfully reached monitoredBarrier, but received errors while waiting "
          r"for send/recv from rank (?P<runner>\d+)",
          "monitored_barrier_timeout", "the monitored barrier failed on rank {runner}", True,
          "This rank reached the monitored barrier, which rank {runner} runs; rank {runner} then "
          "failed, most often because another rank did not arrive in time: its error names "
          "the rank(s), and pgdash shows which one never entered the barrier."),
    _rule(r"collective timeout from\s+rank (?P<peer>\d+)",
          "nccl_watchdog_timeout", "NCCL collective timed out on rank {peer} first", True,
          "Rank {peer} hit the collective timeout first and told every rank to dump: start with "
          "rank {peer}'s log and its Flight Recorder dump, which name the collective it waited "
          "on. The rank(s) that never entered that collective are the culprits, not this rank."),
    _rule(r"Observed flight recorder dump signal from another rank",
          "nccl_watchdog_timeout", "another rank's NCCL collective timed out", True,
          "Another rank timed out first and asked every rank to dump: find the rank whose log "
          "says `collective timeout from this local rank` and start there. Set " + _FR + "."),
    _rule(r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running "
          r"collective: [^\n]{0,2000}?, but Rank (?P<peer>\d+) is running collective",
          "collective_mismatch", "ranks {rank} and {peer} called different collectives", False,
          "Rank {rank} and rank {peer} called different collectives at the same point (compare the "
          "two fingerprints: op, shapes, dtypes): find where their code paths diverge, e.g. a "
          "data-dependent branch or a collective only some ranks call."),
    _rule(r"Detected mismatch between collectives on ranks",
          "collective_mismatch", "ranks called different collectives", False,
          "Ranks called different collectives at the same point (the message shows each one's "
          "op, shapes and dtypes): find where their code paths diverge, e.g. a data-dependent "
          "branch or a collective only some ranks call."),
    _rule(r"ncclRemoteError|remote process exited or there was a network error",
          "nccl_remote_error", "an NCCL peer exited or became unreachable", True,
          "A peer rank exited or dropped off the network during a collective: read the log of the "
          "rank pgdash shows as failed or lost first. If none died, check the network between the "
          "hosts (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET`, `ibstat` for InfiniBand link state)."),
    # --- NCCL: this rank's watchdog timed out (the culprit is whoever it waited for) -----------
    _rule(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+),\s*"
          r"OpType=(?P<op>\w+)",
          "nccl_watchdog_timeout", "NCCL {op} (SeqNum {seq}) timed out waiting for a peer", True,
          "The rank(s) that never entered collective SeqNum={seq} ({op}) on this group are the "
          "culprits, not this rank: pgdash's group view shows who is behind. Set " + _FR + ", and "
          "`TORCH_NCCL_DESYNC_DEBUG=1` to have the lagging ranks named."),
    _rule(r"Timeout at NCCL work: (?P<seq>\d+)"
          r"|detected by watchdog at work(?: sequence id)?: (?P<seq2>\d+)",
          "nccl_watchdog_timeout", "NCCL watchdog caught a failed or timed-out collective", True,
          "The rank(s) that never entered or finished the collective this rank was in are the "
          "culprits: pgdash's group view shows who is behind. Set " + _FR + ", and "
          "`TORCH_NCCL_DESYNC_DEBUG=1` to have the lagging ranks named."),
    _rule(r"Watchdog caught collective operation timeout|collective timeout from this local rank",
          "nccl_watchdog_timeout", "NCCL collective timed out waiting for a peer", True,
          "The rank(s) that never entered the timed-out collective are the culprits, not this "
          "rank: pgdash's group view shows who is behind. Set " + _FR + ", and "
          "`TORCH_NCCL_DESYNC_DEBUG=1` to have the lagging ranks named."),
    _rule(r"Heartbeat monitor timed out|watchdog got stuck for (?P<stuck_s>\d+) seconds",
          "nccl_heartbeat_timeout", "this rank's NCCL watchdog hung inside a CUDA/NCCL call", False,
          "This rank's watchdog thread was blocked inside a CUDA or NCCL call (often a hung GPU): "
          "check `nvidia-smi` and `dmesg -T | grep -i xid` on this host, and `py-spy dump --native "
          "--pid <pid>`. Raise `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC` only if the job still progresses."),
    # --- DDP: this rank's backward did not match what DDP expects ----------------------------
    _rule(r"Expected to have finished reduction in the prior iteration before starting a new "
          r"one[\s\S]*?Parameter indices which did not receive grad for rank \d+: "
          r"(?P<indices>\d+(?: \d+)*)",
          "ddp_unused_parameters", "DDP: parameters got no gradient on this rank", False,
          "Parameters {indices} " + _UNUSED),
    _rule(r"Expected to have finished reduction in the prior iteration before starting a new one",
          "ddp_unused_parameters", "DDP: parameters got no gradient on this rank", False,
          "Some parameters " + _UNUSED),
    _rule(r"Expected to mark a variable ready only once",
          "ddp_ready_twice", "DDP: a parameter's gradient came twice in one backward", False,
          "A parameter of this rank's model produced its gradient twice in one backward: "
          "reentrant activation checkpointing, or a module used twice in `forward`, under DDP. "
          "Use `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, or "
          "`DDP(..., static_graph=True)` if the graph is the same every step."),
    _rule(r"DDP expects same model across all ranks, but Rank (?P<rank>\d+) has "
          r"(?P<params>\d+) params, while rank (?P<peer>\d+) has inconsistent "
          r"(?P<peer_params>\d+) params",
          "ddp_model_mismatch", "DDP: the ranks built different models", False,
          "DDP checks at construction that every rank built the same model, and rank {rank} "
          "has {params} parameters where rank {peer} has {peer_params}: " + _MODEL),
    _rule(r"params\[(?P<param>\d+)\] in this process with sizes (?P<sizes>\[[^\]]*\]|\S+) "
          r"appears not to match (?:sizes|strides) of the same param in process 0",
          "ddp_model_mismatch", "DDP: this rank's model differs from rank 0's", False,
          "DDP checks at construction that every rank built the same model, and parameter "
          "{param} of this rank (sizes {sizes}) differs from rank 0's (each rank whose model "
          "differs from rank 0's raises this; if all the others raised it, rank 0's model is "
          "the odd one): " + _MODEL),
    # --- rendezvous and configuration: this rank (or its launch) is the cause -------------------
    _rule(r"Received data size doesn't match expected size",
          "size_mismatch", "gloo received a different size than expected: a collective mismatch",
          False,
          "Ranks called collectives with different shapes, dtypes or ops at the same point (a "
          "desync in the code, not a network fault): rerun with `TORCH_DISTRIBUTED_DEBUG=DETAIL`, "
          "which names the mismatching ranks and collectives."),
    _rule(r"ProcessGroup\w*::(?P<op>\w+): invalid tensor (?P<what>size|type) at index \d+ "
          r"\(expected (?P<expected_shape>\([^)]*\)|[^,\s]+), got (?P<got>\([^)]*\)|[^)\s]+)\)",
          "bad_tensor", "{op} refused this rank's tensors (a wrong {what})", False,
          "This rank passed {op} a tensor of another {what} than the call needs (expected "
          "{expected_shape}, got {got}), so it never entered the collective and its peers "
          "wait there for it. An all_gather output must be world_size times its input (a "
          "world size read before a resize, or hard-coded), every tensor of a list the same "
          "{what}: print the shapes this rank passes."),
    _rule(r"\brank < size\. (?P<rank>\d+) vs (?P<size>\d+)",
          "rank_out_of_range", "RANK={rank} is not below WORLD_SIZE={size}", False,
          "RANK={rank} but WORLD_SIZE={size}, and RANK must be < WORLD_SIZE: check RANK and "
          "WORLD_SIZE on each rank (an off-by-one RANK, or a WORLD_SIZE smaller than the number "
          "of processes launched)."),
    _rule(r"environment variable (?P<variable>\w+) expected, but not set",
          "missing_env", "environment variable {variable} is not set for env:// rendezvous", False,
          "{variable} is not set on this rank: launch with `torchrun` (it sets RANK, WORLD_SIZE, "
          "LOCAL_RANK, MASTER_ADDR and MASTER_PORT) or `export {variable}=...` on every rank before "
          "`init_process_group`."),
    _rule(r"Unable to find address for: (?P<iface>[\w.:-]{1,64})",
          "gloo_ifname", "gloo found no network interface {iface} on this host", False,
          "GLOO_SOCKET_IFNAME names {iface}, which this rank's host does not have: list its "
          "interfaces with `ip -br addr` and set GLOO_SOCKET_IFNAME to the one the hosts reach "
          "each other on (the same name on every host), or unset it to let gloo pick the "
          "interface of the host's name."),
    _rule(r"Distributed package doesn't have NCCL built in",
          "nccl_not_built", "this torch build has no NCCL", False,
          "This is a CPU-only (or non-Linux) torch build: install a CUDA build of torch (check "
          "`torch.version.cuda`), or use `init_process_group(backend=\"gloo\")`."),
    _rule(r"failed to listen on any local network address\. port: (?P<port>\d+)"
          r"[^\n]{0,200}?(?:EADDRINUSE|address already in use)",
          "addr_in_use", "port {port} is already in use", False,
          "Another process holds port {port} on this host, often a previous run still alive: find "
          "it with `ss -ltnp | grep :{port}`, stop it, or pick another MASTER_PORT."),
    _rule(r"failed to bind to [^\n]{0,100}?:(?P<port>\d+)[^\n]{0,60}?(?:address already in use|EADDRINUSE)",
          "addr_in_use", "port {port} is already in use", False,
          "Another process holds port {port} on this host, often a previous run still alive: find "
          "it with `ss -ltnp | grep :{port}`, stop it, or pick another MASTER_PORT."),
    _rule(r"\[Errno 98\] Address already in use",
          "addr_in_use", "a port its own code listens on is already in use", False,
          "A socket this rank's own code binds (a metrics or debugging server, a store of its "
          "own) found its port taken: two ranks of one host computing the same port (from "
          "`rank % N`, or from RANK where LOCAL_RANK was meant), or a previous run still "
          "alive. The traceback shows the call; `ss -ltnp` names the process that holds it."),
    _rule(r"EADDRINUSE|address already in use",
          "addr_in_use", "a port is already in use", False,
          "Another process holds the port this rank tried to listen on, often a previous run "
          "still alive: find it with `ss -ltnp | grep :$MASTER_PORT`, stop it, or pick another "
          "MASTER_PORT."),
    _rule(r"client socket has timed out after (?P<timeout_ms>\d+)\s*ms while trying to connect to "
          r"\((?P<host>[^,()\s]+), (?P<port>\d+)\)",
          "connect_timeout", "could not connect to the TCPStore at {host}:{port}", False,
          "Nothing accepted a connection at {host}:{port} within {timeout_ms} ms: check that rank 0 "
          "is up, that MASTER_ADDR/MASTER_PORT are the same on every rank, and that no firewall "
          "blocks the port; test with `nc -zv {host} {port}` from this host."),
    _rule(r"TCP client failed to connect/validate to host (?P<host>\S+?):(?P<port>\d+)\b",
          "connect_timeout", "could not connect to the TCPStore at {host}:{port}", False,
          "Nothing accepted a connection at {host}:{port}: check that rank 0 is up, that "
          "MASTER_ADDR/MASTER_PORT are the same on every rank, and that no firewall blocks the "
          "port; test with `nc -zv {host} {port}` from this host."),
    # --- rendezvous: this rank waited for others ------------------------------------------------
    _rule(r"Timed out after (?P<timeout_s>\d+) seconds waiting for clients\. (?P<joined>\d+)/"
          r"(?P<expected>\d+) clients joined",
          "store_clients_timeout", "only {joined} of {expected} ranks joined the TCPStore", True,
          "WORLD_SIZE={expected} but only {joined} rank(s) reached the store within {timeout_s} s, "
          "so {missing} rank(s) never connected to MASTER_ADDR:MASTER_PORT: check that they were "
          "launched, did not crash before `init_process_group`, and use the same "
          "MASTER_ADDR/MASTER_PORT and WORLD_SIZE as rank 0."),
    _rule(r"wait timeout after (?P<timeout_ms>\d+)\s*ms, keys: (?P<keys>[^\s,]*/(?P<peer>\d+))(?=[\s,.]|$)",
          "store_wait_timeout", "rank {peer} never registered in the store", True,
          "This rank waited {timeout_ms} ms for rank {peer} under `{keys}`: either rank {peer} did "
          "not arrive (not launched, or crashed before `init_process_group`), or the ranks disagree "
          "on the group. Compare WORLD_SIZE and RANK on every rank (a mismatched WORLD_SIZE or a "
          "RANK >= WORLD_SIZE leaves a slot empty)."),
    _rule(r"wait timeout after (?P<timeout_ms>\d+)\s*ms, keys: (?P<keys>\S+)",
          "store_wait_timeout", "a rank never registered in the store", True,
          "This rank waited {timeout_ms} ms for `{keys}`: either a rank did not arrive (not "
          "launched, or crashed before `init_process_group`), or the ranks disagree on the group; "
          "compare WORLD_SIZE and RANK on every rank."),
    # --- transport: a peer went away or never answered ------------------------------------------
    _rule(r"Connection closed by peer \[(?P<host>[^\]\s]+)\]:(?P<port>\d+)",
          "peer_closed", "the peer at {host}:{port} closed the connection", True,
          "The rank at {host}:{port} closed its connection mid-collective, so it crashed or was "
          "killed: read that rank's log, and check the OOM killer on {host} "
          "(`dmesg -T | grep -i oom`)."),
    _rule(r"Read error \[(?P<host>[^\]\s]+)\]:(?P<port>\d+): Connection reset by peer",
          "peer_reset", "the peer at {host}:{port} reset the connection", True,
          "The rank at {host}:{port} reset the connection: it aborted, was killed, or hung and "
          "was torn down. Read that rank's log first, and check the OOM killer on {host} "
          "(`dmesg -T | grep -i oom`)."),
    _rule(r"Connection reset by peer",
          "peer_reset", "a peer reset the connection", True,
          "A peer reset the connection: it aborted, was killed, or two ranks share one RANK. "
          "Read the log of the rank pgdash shows as failed or lost first, and check the OOM killer "
          "on its host (`dmesg -T | grep -i oom`)."),
    _rule(r"Timed out waiting (?P<timeout_ms>\d+)\s*ms for (?P<direction>recv|send) operation to complete",
          "gloo_timeout", "gloo collective timed out waiting for a peer", True,
          "This rank's gloo {direction} waited {timeout_ms} ms and no peer answered (gloo does not "
          "say which): a peer never reached the matching collective or is too slow, so look at "
          "which rank pgdash shows as not having entered the collective. Raise "
          "`init_process_group(timeout=...)` only if that peer is merely slow."),
    _rule(r"Operation timed out!",
          "work_wait_timeout", "the wait(timeout=...) on an async collective expired", True,
          "This rank's `work.wait(timeout=...)` expired before the collective completed (the "
          "timeout is the script's own, c10d does not say which peer): a peer never reached "
          "the matching collective or is too slow, so look at which rank pgdash shows as not "
          "having entered it. Raise the timeout only if that peer is merely slow."),
    _rule(r"Failed to check the \"should dump\" flag on TCPStore",
          "store_gone", "the TCPStore went away before this rank finished", True,
          "The TCPStore (hosted by rank 0 at MASTER_ADDR:MASTER_PORT) shut down while this rank "
          "still used it: rank 0 exited or crashed first, so read rank 0's log."),
)

# Values read from anywhere in the text, whatever rule matched; the rule's own groups win.
EXTRACTORS: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"WorkNCCL\(SeqNum=(?P<seq>\d+)",
    r"OpType=(?P<op>\w+)",
    r"NumelIn=(?P<numel_in>-?\d+)",
    r"NumelOut=(?P<numel_out>-?\d+)",
    r"Timeout\(ms\)=(?P<timeout_ms>\d+)",
    r"ran for (?P<ran_ms>\d+) milliseconds",
    r"last enqueued (?:NCCL )?work: (?P<last_enqueued>-?\d+), last completed (?:NCCL )?work: "
    r"(?P<last_completed>-?\d+)",
    r"NCCL version (?P<nccl_version>\d+\.\d+\.\d+)",
    r"\[PG (?:ID )?(?P<pg>\d+)\b",
    r"PG GUID \d+\((?P<pg_name>[^)\s]+)\)",
))
