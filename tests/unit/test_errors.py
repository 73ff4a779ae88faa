"""Unit tests for dashboard.diagnosis.errors: each known error text, verbatim, to its cause, values and hint."""

from __future__ import annotations

import random
import re
import string

import pytest

from dashboard.diagnosis import errors, known_errors
from dashboard.diagnosis.errors import Cause, classify, classify_error

# Verbatim texts from shared/notes/torch-2.13-facts.md §4, with realistic build-root prefixes.
GLOO_RECV_TIMEOUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                     "Timed out waiting 4000ms for recv operation to complete")
GLOO_SEND_TIMEOUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
                     "Timed out waiting 1800000ms for send operation to complete")
PEER_CLOSED = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:13221. This is typically caused by a remote worker crashing. Check the "
               "logs of the remote worker before reporting an error. GLHF! 🏖️")
PEER_RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:17549: Connection reset by peer. This is typically caused by a remote "
              "worker hanging or bugs in the application. Check the logs of the remote worker before "
              "reporting an error. GLHF! 🏖️")
SIZE_MISMATCH = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  "
                 "[enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:510] "
                 "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected "
                 "size. Is there a distributed collective mismatch in your code?")
# c10d's Work::wait(timeout) (torch/csrc/distributed/c10d/Work.cpp), an async collective's
# wait(timeout=timedelta(seconds=6)) on gloo, as torch 2.13 raised it in bench/corpus.
WORK_WAIT = "Operation timed out!"
# Python's own socket (a metrics server the training code starts), bench/corpus
# metrics_port_in_use_one_rank: not the rendezvous's port.
OWN_PORT = "[Errno 98] Address already in use"
STORE_CLIENTS = "Timed out after 5 seconds waiting for clients. 1/2 clients joined."
CONNECT_TIMEOUT = ("The client socket has timed out after 4000ms while trying to connect to "
                   "(127.0.0.1, 29602).")
CONNECT_RETRY_LOG = ("[W1129 18:06:24.123456 socket.cpp:752] [c10d] TCP client failed to "
                     "connect/validate to host 10.1.2.3:29602 - retrying (try=0, timeout=4000ms, "
                     "delay=3580ms): Connection refused")
ADDR_IN_USE = ("The server socket has failed to listen on any local network address. port: 29603, "
               "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
ADDR_IN_USE_OLD = ("The server socket has failed to bind to [::]:29500 (errno: 98 - Address already "
                   "in use).")
MISSING_RANK = ("Error initializing torch.distributed using env:// rendezvous: environment variable "
                "RANK expected, but not set")
RANK_OUT_OF_RANGE = "[enforce fail at /pytorch/third_party/gloo/gloo/context.cc:23] rank < size. 2 vs 2"
STORE_WAIT = "wait timeout after 4000ms, keys: /default_pg/0//cpu//0/2"
NCCL_NOT_BUILT = "Distributed package doesn't have NCCL built in"

WATCHDOG = ("[rank0]:[E606 09:09:08.164985384 ProcessGroupNCCL.cpp:757] [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLGATHER, NumelIn=1, "
            "NumelOut=4, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.")
WATCHDOG_LOG = WATCHDOG + """
[rank0]:[E606 09:09:08.165 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 1 PG status: last enqueued work: 1, last completed work: -1
[rank0]:[E606 09:09:08.166 ProcessGroupNCCL.cpp:801] Stack trace of the failed collective:
#0 _verify_param_shape_across_processes from .../torch/distributed/utils.py:286
#1 __init__ from .../torch/nn/parallel/distributed.py:1020
[rank0]:[E606 09:09:08.167 ProcessGroupNCCL.cpp:2732] [PG ID 0 PG GUID 0(default_pg) Rank 0] First PG on this rank to signal dumping.
[rank0]:[E606 09:09:08.168 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 1, last completed NCCL work: -1.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc.
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLGATHER, NumelIn=1, NumelOut=4, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.
Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:760 (most recent call first):
"""
TIMEOUT_AT_WORK = ("[PG 1 Rank 1] Timeout at NCCL work: 158046, last enqueued NCCL work: 158046, "
                   "last completed NCCL work: 158045.")
DETECTED_AT_WORK = ("[PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) "
                    "detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed "
                    "NCCL work: 807.")
DETECTED_AT_SEQ_ID = ("[PG ID 1 PG GUID 1 Rank 0]  failure detected by watchdog at work sequence id: "
                      "2847 PG status: last enqueued work: 2855, last completed work: 2846")
PEER_DUMP = ("[rank5]:[E703 17:54:18.884528282 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID "
             "0(default_pg) Rank 5] Received a dump signal due to a collective timeout from  rank 7 "
             "and we will try our best to dump the debug info. Last enqueued NCCL work: 56116, last "
             "completed NCCL work: 56116.This is most likely caused by incorrect usages of "
             "collectives, e.g., wrong sizes used across ranks, the order of collectives is not same "
             "for all ranks or the scheduled collective, for some reason, didn't run.")
OBSERVED_DUMP = ("[rank5]:[E703 17:54:18.884325830 ProcessGroupNCCL.cpp:1922] [PG ID 0 PG GUID "
                 "0(default_pg) Rank 5] Observed flight recorder dump signal from another rank via "
                 "TCPStore.")
DESYNC_REPORT = """[rank0]:[E515 10:00:00.000 ProcessGroupNCCL.cpp:1937] Rank 0
\t - [0] Timeout at collective: ALLREDUCE, #315
\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
\t     [7] finished collective #182, but didn't join collective #183 (count from 1)
\t - Snapshot of ranks' latest states:
\t   #182 finished ranks:
\t     [7] finished ALLREDUCE
\t   #315 started ranks:
\t     [0, 1, 2] started ALLREDUCE"""
HEARTBEAT = ("[PG 0 Rank 25] Heartbeat monitor timed out! Process will be terminated after dumping "
             "debug info. workMetaList_.size()=2")
ASYNC_REMOTE = ("[Rank 0] Collective WorkNCCL(SeqNum=89, OpType=ALLREDUCE, NumelIn=67108864, "
                "Timeout(ms)=90000) raised the following async exception: NCCL error: remote process "
                "exited or there was a network error")
NCCL_REMOTE = ("torch.distributed.DistBackendError: NCCL error in: "
               "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or there "
               "was a network error, NCCL version 2.26.2\nncclRemoteError: A call failed possibly due "
               "to a network error or a remote process exiting prematurely.\nLast error:\n"
               "socketPollConnect: connect returned Connection refused, exceeded error retry count (35)")
NCCL_CUDA = ("torch.distributed.DistBackendError: NCCL error in: "
             "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3385, unhandled cuda error "
             "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: "
             "Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'")
NCCL_SYSTEM = ("torch.distributed.DistBackendError: NCCL error in: "
               "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled system error (run "
               "with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\nncclSystemError: System call "
               "(e.g. socket, malloc) or external library call failed or device error. \nLast error:\n"
               "Error while creating shared memory segment /dev/shm/nccl-vzIpS6 (size 9637888)")
NCCL_DUP_GPU = ("torch.distributed.DistBackendError: NCCL error in: "
                "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:317, invalid usage (run with "
                "NCCL_DEBUG=WARN for details), NCCL version 2.21.5\nncclInvalidUsage: This usually "
                "reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 "
                "and rank 0 both on CUDA device 1000")
NCCL_INVALID = ("torch.distributed.DistBackendError: NCCL error in: "
                "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:317, invalid usage (run with "
                "NCCL_DEBUG=WARN for details), NCCL version 2.21.5")
MONITORED_BARRIER = ("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms\n Original exception: "
                     "\n[gloo/transport/tcp/pair.cc:598] Connection closed by peer "
                     "[2401:db00:eef0:1100:3560:0:1c05:25d]:8594")
MONITORED_BARRIER_RANK = (
    "Rank 1 successfully reached monitoredBarrier, but received errors while waiting for "
    "send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original exception: \n"
    + PEER_CLOSED)
# torch/utils/data/dataloader.py and libtorch's signal handling, torch 2.13.
LOADER_KILLED = "DataLoader worker (pid 2017) is killed by signal: Killed. "
LOADER_BUS = "DataLoader worker (pid 2017) is killed by signal: Bus error. "
LOADER_SEGV = "DataLoader worker (pid 2017) is killed by signal: Segmentation fault. "
LOADER_EXITED = "DataLoader worker (pid(s) 2017, 2018) exited unexpectedly"
SHM_FULL = ("unable to write to file </torch_2011_2857165817_0>: No space left on device (28)")
# torch/csrc/distributed/c10d/reducer.cpp, torch 2.13, as rank 2 of a real DDP job raised it.
DDP_UNUSED = (
    "Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing "
    "loss. You can enable unused parameter detection by passing the keyword argument "
    "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by \n"
    "making sure all `forward` function outputs participate in calculating loss. \n"
    "Parameter indices which did not receive grad for rank 2: 2 3\n In addition, you can set "
    "the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL")
DDP_TWICE = ("Expected to mark a variable ready only once. This error is caused by one of the "
             "following reasons: 1) Use of a module parameter outside the `forward` function.")

# reducer.cpp's construction check, torch 2.13, as real 3-rank jobs raised it (a layer more on
# rank 2; a narrower layer on rank 1).
DDP_COUNTS = ("DDP expects same model across all ranks, but Rank 2 has 6 params, while rank 0 "
              "has inconsistent 4 params.")
DDP_SHAPES = ("[1]: params[0] in this process with sizes [16, 32] appears not to match sizes of "
              "the same param in process 0.")
# A write to a full disk: Python's OSError; torch.save(obj, "/dev/full") in torch 2.13 (its
# writer's own text, the iostream error before it); a full quota.
DISK_FULL = "[Errno 28] No space left on device"
SAVE_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
SAVE_WRITE = "PytorchStreamWriter failed writing file data/3: file write failed"
# torch.distributed.checkpoint's text on every rank when rank 1's storage writer raised
# (bench/corpus/dcp_save_one_rank_fails.py; frames shortened).
DCP_FAILED = (
    "CheckpointException ranks:dict_keys([1])\nTraceback (most recent call last): (RANK 1)\n"
    '  File ".../torch/distributed/checkpoint/utils.py", line 241, in all_reduce\n'
    "    local_data = map_fun()\n"
    '  File "/tmp/train.py", line 27, in write_data\n'
    '    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/scratch/ckpt/__1_0.distcp")\n'
    "OSError: [Errno 28] No space left on device: '/scratch/ckpt/__1_0.distcp'\n")
# ProcessGroupGloo on a host without the interface GLOO_SOCKET_IFNAME names (torch 2.13).
GLOO_IFNAME = ("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
               "device.cc:84] ifa != nullptr. Unable to find address for: ib0")
BAD_TENSOR = ("ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (4), got "
              "(3))")
NO_MODULE = "No module named 'flash_attn.ops'"
QUOTA = "[Errno 122] Disk quota exceeded: '/home/u/ckpt/step_4000.pt'"


@pytest.mark.parametrize("text, cause, victim, details", [
    (GLOO_RECV_TIMEOUT, "gloo_timeout", True, {"timeout_ms": 4000, "direction": "recv"}),
    (GLOO_SEND_TIMEOUT, "gloo_timeout", True, {"timeout_ms": 1800000, "direction": "send"}),
    (PEER_CLOSED, "peer_closed", True, {"host": "127.0.0.1", "port": 13221}),
    (PEER_RESET, "peer_reset", True, {"host": "127.0.0.1", "port": 17549}),
    (SIZE_MISMATCH, "size_mismatch", False, {}),
    (STORE_CLIENTS, "store_clients_timeout", True,
     {"joined": 1, "expected": 2, "missing": 1, "timeout_s": 5}),
    (CONNECT_TIMEOUT, "connect_timeout", False,
     {"host": "127.0.0.1", "port": 29602, "timeout_ms": 4000}),
    (CONNECT_RETRY_LOG, "connect_timeout", False, {"host": "10.1.2.3", "port": 29602}),
    (ADDR_IN_USE, "addr_in_use", False, {"port": 29603}),
    (ADDR_IN_USE_OLD, "addr_in_use", False, {"port": 29500}),
    (MISSING_RANK, "missing_env", False, {"variable": "RANK"}),
    (RANK_OUT_OF_RANGE, "rank_out_of_range", False, {"rank": 2, "size": 2}),
    (STORE_WAIT, "store_wait_timeout", True,
     {"timeout_ms": 4000, "keys": "/default_pg/0//cpu//0/2", "peer": 2}),
    (NCCL_NOT_BUILT, "nccl_not_built", False, {}),
    (WATCHDOG, "nccl_watchdog_timeout", True,
     {"seq": 1, "op": "ALLGATHER", "numel_in": 1, "numel_out": 4, "timeout_ms": 600000,
      "ran_ms": 600004}),
    (WATCHDOG_LOG, "nccl_watchdog_timeout", True,
     {"seq": 1, "op": "ALLGATHER", "last_enqueued": 1, "last_completed": -1, "pg": 0,
      "pg_name": "default_pg"}),
    (TIMEOUT_AT_WORK, "nccl_watchdog_timeout", True,
     {"seq": 158046, "last_enqueued": 158046, "last_completed": 158045, "pg": 1}),
    (DETECTED_AT_WORK, "nccl_watchdog_timeout", True,
     {"seq": 808, "last_enqueued": 811, "last_completed": 807}),
    (DETECTED_AT_SEQ_ID, "nccl_watchdog_timeout", True,
     {"seq": 2847, "last_enqueued": 2855, "last_completed": 2846, "pg": 1}),
    (PEER_DUMP, "nccl_watchdog_timeout", True,
     {"peer": 7, "last_enqueued": 56116, "last_completed": 56116}),
    (OBSERVED_DUMP, "nccl_watchdog_timeout", True, {"pg": 0}),
    (DESYNC_REPORT, "nccl_watchdog_timeout", True,
     {"peers": [7], "peer": 7, "last_finished": 182, "seq": 183}),
    (HEARTBEAT, "nccl_heartbeat_timeout", False, {"pg": 0}),
    (ASYNC_REMOTE, "nccl_remote_error", True,
     {"seq": 89, "op": "ALLREDUCE", "numel_in": 67108864, "timeout_ms": 90000}),
    (NCCL_REMOTE, "nccl_remote_error", True, {"nccl_version": "2.26.2"}),
    (NCCL_CUDA, "nccl_cuda_error", False, {"nccl_version": "2.21.5"}),
    (NCCL_SYSTEM, "nccl_system_error", False, {"nccl_version": "2.20.5"}),
    (NCCL_DUP_GPU, "nccl_invalid_usage", False,
     {"ranks": [1, 0], "device": "1000", "nccl_version": "2.21.5"}),
    (NCCL_INVALID, "nccl_invalid_usage", False, {"nccl_version": "2.21.5"}),
    (MONITORED_BARRIER, "monitored_barrier_timeout", True,
     {"peers": [1], "peer": 1, "timeout_ms": 2000}),
    (MONITORED_BARRIER_RANK, "monitored_barrier_timeout", True, {"runner": "0"}),
    (WORK_WAIT, "work_wait_timeout", True, {}),
    (OWN_PORT, "addr_in_use", False, {}),
    (LOADER_KILLED, "dataloader_killed", False, {"worker": "2017"}),
    (LOADER_BUS, "dataloader_shm", False, {"worker": "2017"}),
    (LOADER_SEGV, "dataloader_worker_died", False, {"signal": "Segmentation fault"}),
    (LOADER_EXITED, "dataloader_worker_died", False, {"worker": "2017, 2018"}),
    (SHM_FULL, "dataloader_shm", False, {}),
    (DDP_UNUSED, "ddp_unused_parameters", False, {"indices": "2 3"}),
    (DDP_UNUSED.split(" This error")[0], "ddp_unused_parameters", False, {}),
    (DDP_TWICE, "ddp_ready_twice", False, {}),
    (DDP_COUNTS, "ddp_model_mismatch", False, {"rank": 2, "params": 6, "peer": 0,
                                               "peer_params": 4}),
    (DDP_SHAPES, "ddp_model_mismatch", False, {"param": 0, "sizes": "[16, 32]"}),
    (DISK_FULL, "disk_full", False, {}),
    (SAVE_FULL, "disk_full", False, {}),
    (SAVE_WRITE, "disk_full", False, {"file": "data/3"}),
    (QUOTA, "disk_full", False, {}),
    (NO_MODULE, "module_missing", False, {"module": "flash_attn.ops"}),
    (DCP_FAILED, "checkpoint_failed", False, {"ranks": [1], "inner": "disk_full"}),
    (DCP_FAILED.split("\nTraceback")[0], "checkpoint_failed", False, {"ranks": [1]}),
    (GLOO_IFNAME, "gloo_ifname", False, {"iface": "ib0"}),
    (BAD_TENSOR, "bad_tensor", False, {"op": "allgather", "what": "size",
                                       "expected_shape": "(4)", "got": "(3)"}),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None)
def test_verbatim_texts(text, cause, victim, details):
    got = classify(text)
    assert got.cause == cause
    assert got.victim is victim
    assert {k: got.details.get(k) for k in details} == details
    assert got.title and "\n" not in got.title
    assert got.hint and not re.search(r"<(?!pid>)\w+>", got.hint), got.hint  # every value filled in


@pytest.mark.parametrize("text, needles", [
    (CONNECT_TIMEOUT, ["`nc -zv 127.0.0.1 29602`", "MASTER_ADDR", "4000 ms"]),
    (CONNECT_RETRY_LOG, ["`nc -zv 10.1.2.3 29602`"]),
    (ADDR_IN_USE, ["`ss -ltnp | grep :29603`", "MASTER_PORT"]),
    (PEER_CLOSED, ["127.0.0.1:13221", "dmesg -T | grep -i oom"]),
    (PEER_RESET, ["127.0.0.1:17549"]),
    (MISSING_RANK, ["RANK is not set", "torchrun", "export RANK="]),
    (RANK_OUT_OF_RANGE, ["RANK=2 but WORLD_SIZE=2"]),
    (STORE_CLIENTS, ["WORLD_SIZE=2", "only 1 rank(s)", "1 rank(s) never connected",
                     "MASTER_ADDR:MASTER_PORT"]),
    (STORE_WAIT, ["rank 2", "WORLD_SIZE", "/default_pg/0//cpu//0/2"]),
    (GLOO_RECV_TIMEOUT, ["4000 ms", "init_process_group(timeout=...)"]),
    (SIZE_MISMATCH, ["TORCH_DISTRIBUTED_DEBUG=DETAIL"]),
    (NCCL_NOT_BUILT, ['backend="gloo"']),
    (WATCHDOG, ["SeqNum=1", "ALLGATHER", "TORCH_NCCL_DUMP_ON_TIMEOUT=1", "TORCH_FR_BUFFER_SIZE",
                "TORCH_NCCL_DESYNC_DEBUG=1"]),
    (PEER_DUMP, ["rank 7"]),
    (DESYNC_REPORT, ["rank(s) 7", "#183"]),
    (NCCL_CUDA, ["nvidia-smi -q -d ECC,PAGE_RETIREMENT", "NCCL_DEBUG=INFO"]),
    (NCCL_SYSTEM, ["NCCL_DEBUG_SUBSYS=INIT,NET", "/dev/shm", "NCCL_SOCKET_IFNAME"]),
    (NCCL_DUP_GPU, ["Ranks 1, 0", "torch.cuda.set_device(local_rank)", "CUDA_VISIBLE_DEVICES"]),
    (MONITORED_BARRIER, ["Rank(s) 1", "2000 ms"]),
    (MONITORED_BARRIER_RANK, ["rank 0 runs"]),
    (LOADER_KILLED, ["pid 2017", "OOM killer", "dmesg -T", "num_workers"]),
    (LOADER_BUS, ["/dev/shm", "--shm-size"]),
    (LOADER_EXITED, ["pid 2017, 2018", "num_workers=0"]),
    (SHM_FULL, ["/dev/shm", "df -h /dev/shm"]),
    (DDP_UNUSED, ["Parameters 2 3", "find_unused_parameters=True"]),
    (DDP_TWICE, ["use_reentrant=False", "static_graph=True"]),
    (DDP_COUNTS, ["rank 2 has 6 parameters where rank 0 has 4"]),
    (DDP_SHAPES, ["parameter 0 of this rank (sizes [16, 32])", "rank 0's model is the odd one"]),
    (DISK_FULL, ["df -h"]),
    (SAVE_FULL, ["torch.save", "df -h"]),
    (NO_MODULE, ["`import flash_attn.ops` failed", "pip list"]),
    (DCP_FAILED, ["df -h"]),
    (DCP_FAILED.split("\nTraceback")[0], ["rank(s) 1, whose own error", "an echo"]),
    (GLOO_IFNAME, ["GLOO_SOCKET_IFNAME names ib0", "ip -br addr"]),
    (BAD_TENSOR, ["(expected (4), got (3))", "world_size times its input"]),
])
def test_hint_uses_parsed_values(text, needles):
    hint = classify(text).hint
    for needle in needles:
        assert needle in hint, (needle, hint)


@pytest.mark.parametrize("variable", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_missing_env_names_the_variable(variable):
    text = ("Error initializing torch.distributed using env:// rendezvous: environment variable "
            f"{variable} expected, but not set")
    got = classify(text, "ValueError")
    assert (got.cause, got.details["variable"]) == ("missing_env", variable)
    assert f"export {variable}=" in got.hint and variable in got.title


def test_peer_dump_points_at_the_peer_not_this_rank():
    got = classify(PEER_DUMP)
    assert got.details["peer"] == 7
    assert "rank 7" in got.title and got.hint.lower().count("rank 7") >= 2


def test_own_dump_signal_names_no_peer():
    own = next(line for line in WATCHDOG_LOG.splitlines() if "from this local rank" in line)
    got = classify(own)
    assert got.cause == "nccl_watchdog_timeout" and "peer" not in got.details
    assert got.details["last_completed"] == -1


@pytest.mark.parametrize("text, cause", [
    # The watchdog text also says "timeout" and "timing out"; the NCCL rule must win.
    (WATCHDOG, "nccl_watchdog_timeout"),
    # A peer that names the rank that timed out first beats this rank's own watchdog timeout.
    (WATCHDOG + "\n" + PEER_DUMP, "nccl_watchdog_timeout"),
    # monitored_barrier names the rank; its "Original exception" is a gloo peer_closed.
    (MONITORED_BARRIER, "monitored_barrier_timeout"),
    # The duplicate-GPU detail is one case of invalid usage, with the ranks parsed.
    (NCCL_DUP_GPU, "nccl_invalid_usage"),
    # NCCL system error whose last error mentions a reset connection stays an NCCL system error.
    (NCCL_SYSTEM.replace("Error while creating shared memory segment /dev/shm/nccl-vzIpS6 (size "
                         "9637888)", "Connection reset by peer"), "nccl_system_error"),
    # A CUDA error on this rank beats the timeout it later caused.
    (WATCHDOG + "\n" + NCCL_CUDA, "nccl_cuda_error"),
    # The misconfigured rank's enforce failure beats the store wait it causes on the master.
    ("wait timeout after 4000ms, keys: /default_pg/0//cpu//0/1\n" + RANK_OUT_OF_RANGE,
     "rank_out_of_range"),
    # A named peer address beats gloo's anonymous timeout.
    (GLOO_RECV_TIMEOUT + "\n" + PEER_CLOSED, "peer_closed"),
    (SIZE_MISMATCH + "\n" + GLOO_RECV_TIMEOUT, "size_mismatch"),
])
def test_most_specific_rule_wins(text, cause):
    assert classify(text).cause == cause


def test_most_specific_wins_on_peer_details():
    got = classify(WATCHDOG + "\n" + PEER_DUMP)
    assert got.details["peer"] == 7
    assert got.details["seq"] == 1 and got.details["op"] == "ALLGATHER"  # still parsed from the rest


def test_desync_report_with_several_lagging_ranks():
    text = ("\t   - [47] joined but didn't finish collective #41207 (count from 1)\n"
            "\t     [0, 1, 2] finished collective #41207, but didn't join collective #41208 "
            "(count from 1)")
    got = classify(text)
    assert got.cause == "nccl_watchdog_timeout" and got.victim
    assert got.details["peers"] == [47] and got.details["seq"] == 41207
    several = classify("[0, 1, 2] finished collective #41207, but didn't join collective #41208")
    assert several.details["peers"] == [0, 1, 2] and "peer" not in several.details
    assert "0, 1, 2" in several.hint


def test_texts_vary_across_builds():
    # Another build root, another line number, an IPv6 peer, an older NCCL prefix.
    assert classify("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                    "waiting 30000ms for recv operation to complete").details["timeout_ms"] == 30000
    got = classify("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [::1]:8594")
    assert (got.cause, got.details["host"], got.details["port"]) == ("peer_closed", "::1", 8594)
    got = classify("[Rank 6] NCCL watchdog thread terminated with exception: [Rank 6] Watchdog caught "
                   "collective operation timeout: WorkNCCL(SeqNum=5, OpType=BROADCAST, NumelIn=10, "
                   "NumelOut=10, Timeout(ms)=1800000) ran for 1800345 milliseconds before timing out.")
    assert (got.cause, got.details["seq"], got.details["op"]) == ("nccl_watchdog_timeout", 5, "BROADCAST")


def test_error_type_is_recorded():
    got = classify(STORE_CLIENTS, "DistStoreError")
    assert got.details["error_type"] == "DistStoreError"


@pytest.mark.parametrize("error_type, needle", [
    (None, "TORCH_DISTRIBUTED_DEBUG=DETAIL"),
    ("RuntimeError", "NCCL_DEBUG=INFO"),
    ("DistStoreError", "MASTER_PORT"),
    ("DistNetworkError", "nc -zv"),
    ("DistBackendError", "NCCL WARN"),
])
def test_unknown_text_gets_a_useful_generic_hint(error_type, needle):
    got = classify("RuntimeError: boom on rank 1", error_type)
    assert got.cause == "unknown" and got.victim is False
    assert needle in got.hint and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in got.hint


@pytest.mark.parametrize("junk", [
    None,
    "",
    "   \n\t",
    b"\xff\xfe\x00binary\x80junk",
    "\udcff\udcfe surrogates \x00 NUL",
    "x" * 1_000_000,
    "9" * 100_000,
    "{seq} {0} %s <host>",
    12345,
    bytearray(b"Timed out waiting 4000ms for recv operation to complete"),
])
def test_never_raises(junk):
    got = classify(junk, error_type=junk if not isinstance(junk, str) else None)
    assert isinstance(got, Cause) and got.hint and got.title


def test_megabyte_of_random_junk():
    rng = random.Random(0)
    junk = "".join(rng.choice(string.printable + "[]():/#🏖️") for _ in range(1_000_000))
    assert isinstance(classify(junk), Cause)


def test_huge_text_scans_head_and_tail():
    filler = "x" * 1_000_000
    assert classify(filler + PEER_CLOSED).cause == "peer_closed"  # a traceback ends with the error
    assert classify(PEER_CLOSED + filler).cause == "peer_closed"
    assert classify(filler[:errors.MAX_SCAN_CHARS] + PEER_CLOSED + filler).cause == "unknown"


def test_bytes_are_decoded():
    assert classify(PEER_CLOSED.encode()).details["port"] == 13221
    assert classify(bytearray(GLOO_RECV_TIMEOUT.encode())).cause == "gloo_timeout"
    assert classify(b"\xff\xfe" + MISSING_RANK.encode() + b"\x80").details["variable"] == "RANK"


def test_every_template_field_comes_from_its_pattern():
    fmt = string.Formatter()
    for rule in known_errors.RULES:
        groups = {errors._ALIASES.get(g, g) for g in rule.pattern.groupindex}
        available = groups | {name for name, sources in errors._DERIVED.items()
                              if set(sources) <= groups}
        for template in (rule.title, rule.hint):
            fields = {f for _, f, _, _ in fmt.parse(template) if f is not None}
            assert fields <= available, (rule.cause, fields - available)


def test_hints_stay_short():
    texts = [v for k, v in globals().items() if k.isupper() and isinstance(v, str)]
    for text in texts:
        got = classify(text)
        assert len(got.hint) <= 450, (got.cause, len(got.hint))
        assert len(got.title) <= 100, got.title


CUDA_ASSERT = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be "
               "asynchronously reported at some other API call, so the stacktrace below might "
               "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")


def test_a_cuda_error_is_this_ranks_and_its_traceback_line_may_not_be_the_kernel():
    got = classify(CUDA_ASSERT, "RuntimeError")
    assert (got.cause, got.victim) == ("cuda_error", False)
    assert got.title == "a CUDA error on this rank's GPU (device-side assert triggered)"
    assert "CUDA_LAUNCH_BLOCKING=1" in got.hint


def test_an_unknown_error_on_a_gloo_job_gets_no_nccl_advice():
    assert "NCCL_DEBUG" in classify("something odd").hint
    hint = classify("something odd", backend="gloo").hint
    assert "NCCL" not in hint and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in hint


def test_an_unknown_error_is_named_by_the_known_exception_it_was_raised_from():
    err = {"error": "could not save the checkpoint", "error_type": "RuntimeError",
           "causes": [{"error_type": "OSError", "error": DISK_FULL}]}
    got = classify_error(err)
    assert got.cause == "disk_full"
    assert got.details["raised_as"] == "RuntimeError"
    assert got.details["raised_from"] == "OSError: " + DISK_FULL
    # Its own known text wins over the chain; an unknown chain leaves it unknown; a malformed
    # chain (a foreign server's store) does no harm.
    assert classify_error({**err, "error": SAVE_FULL}).details.get("raised_from") is None
    assert classify_error({**err, "causes": [{"error_type": "E", "error": "?"}]}).cause == \
        "unknown"
    assert classify_error({**err, "causes": [None, 5]}).cause == "unknown"


def test_the_agent_sends_the_chain_as_python_prints_it_nearest_first_and_bounded():
    from pgdash_agent.failures import error_causes
    from pgdash_agent.wire import MAX_CAUSES

    def raised(make):
        try:
            make()
        except Exception as exc:
            return exc

    def wrapped():
        try:
            raise OSError(28, "No space left on device")
        except OSError as exc:
            raise RuntimeError("could not save") from exc

    def while_handling():
        try:
            {}["step"]
        except KeyError:
            raise ValueError("bad config")

    def hidden():
        try:
            {}["step"]
        except KeyError:
            raise ValueError("bad config") from None

    assert error_causes(raised(wrapped)) == [
        {"error_type": "OSError", "error": "[Errno 28] No space left on device"}]
    assert error_causes(raised(while_handling)) == [{"error_type": "KeyError",
                                                     "error": "'step'"}]
    assert error_causes(raised(hidden)) == []
    chain = [ValueError(str(i)) for i in range(9)]
    for earlier, later in zip(chain, chain[1:]):
        later.__cause__ = earlier
    assert MAX_CAUSES == 4
    assert [c["error"] for c in error_causes(chain[-1])] == ["7", "6", "5", "4"]
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a  # a cycle ends the walk
    assert error_causes(a) == [{"error_type": "ValueError", "error": "b"}]


def test_a_wrapped_error_leads_with_the_error_it_wraps():
    got = classify(DCP_FAILED)
    assert got.title == ("a write failed: the disk (or the quota) is full "
                         "(dcp raised the failure of rank(s) 1 on every rank)")
    assert got.hint.startswith("A file this rank wrote")
