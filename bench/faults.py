#!/usr/bin/python3
"""Kills or stops one worker of a small training job at a random moment, or signals its
launcher, or kills a worker while it writes a checkpoint, or puts a stranger on its store's port,
and checks what dtorch promises about it: the job ends within the timeout, names the cause,
leaves no process and no /dev/shm segment behind, and `--resume` ends with the uninterrupted
run's final epoch record.

Per layout (--configs): one uninterrupted reference run, then --trials counted trials (at most
twice --trials draws: a run that finished first is drawn again). A trial starts the same run in
a fresh --out folder, waits a random 1 s .. 90% of the reference's duration, picks a random
worker (a process whose parent is a launcher) and does one of --actions (drawn at random):
SIGKILL or SIGSTOP to the worker; SIGTERM or SIGUSR1 (the checkpoint signal) to a launcher;
SIGKILL to the worker at the first moment a checkpoint's temporary file (checkpoint-*.tmp, a
sharded step's *.partial folder) is seen in --out ("kill-in-save"); or a stranger on the store's
port (the worker's MASTER_PORT) that sends one byte and holds the connection, and another that
announces a SET of a 2 GiB key. It records the rank (the worker's RANK), the seconds from the
fault until the launcher exited (elastic: both launchers), the exit codes, whether stderr names
the cause (the rank: "rank R", or R in a "rank(s) ..." list, on a line other than the launcher's
round, waiting and grace-period notices; the launcher's signal; the store that stopped
answering), the processes left whose command line holds the --out folder (then SIGKILLed) and
the dtorch-* segments left in /dev/shm, and reruns the command with --resume to compare the last
"epoch" record of metrics.jsonl (epoch, train_loss, test_loss, test_accuracy) with the
reference's. A trial passes when every launcher exited within DTORCH_TIMEOUT + 10 s with what
the fault calls for (non-zero; 75 after SIGUSR1, as every rank checkpoints and stops; 0 with a
stranger where the store is LibTorch 2.4+'s libuv server, which serves the job around it, and
then without a --resume), the cause was named, nothing was left, and the final record equals the
reference's bit for bit (elastic included: it resumes at the same world size). A run that ended
before the fault landed (no live worker, every launcher exited 0, no checkpoint write seen, or a
worker stopped or killed after the last epoch while the others exited 0, which no launcher can
tell from a slow one or one that failed as it exited) is "finished first" and not counted. A
launcher still running 60 s after the fault is killed and the trial fails.

The binary and the libdtorch it links from its folder are copied into the work folder first, so
a rebuild during the trials does not change what is tested (--no-copy runs --dtorch itself).
Usage: nice -n 10 bench/faults.py [--dtorch build/dtorch] [--trials 20]
           [--configs ddp,zero3,zero3-async,tp2,pp2-1f1b,pp2-zb,elastic] [--seed S]
           [--actions SIGKILL,SIGSTOP,SIGTERM-launcher,SIGUSR1-launcher,kill-in-save,stranger]
           [--timeout 10]
           [--markdown docs/reliability.md] [--keep]
"""
import argparse
import datetime
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import ROOT, libtorch_version, machine, replace_block

MLP = ["--model", "mnist-mlp", "--epochs", "6", "--train-samples", "16384", "--test-samples",
       "128", "--batch-size", "32"]
GPT = ["--model", "gpt-debug", "--data", "text", "--epochs", "3", "--train-samples", "1024",
       "--test-samples", "128", "--batch-size", "32"]
CONFIGS = {  # train flags; elastic runs two c10d launchers of one worker each instead
    "ddp": MLP + ["--strategy", "ddp"],
    "zero3": MLP + ["--strategy", "zero3"],
    # checkpoints written in the background: a kill during one must leave the previous
    "zero3-async": MLP + ["--strategy", "zero3", "--async-checkpoint"],
    "tp2": GPT + ["--tp", "2"],
    "pp2-1f1b": GPT + ["--pp", "2", "--schedule", "1f1b"],
    "pp2-zb": GPT + ["--pp", "2", "--schedule", "zb"],
    "elastic": MLP + ["--strategy", "ddp"],
}
FIELDS = ("epoch", "train_loss", "test_loss", "test_accuracy")
ACTIONS = ("SIGKILL", "SIGSTOP", "SIGTERM-launcher", "SIGUSR1-launcher", "kill-in-save",
           "stranger")
CHECKPOINTED = 75  # a job whose ranks checkpointed on the checkpoint signal and stopped
HANG_S = 60
# launcher lines that mention a rank without blaming it
ROUTINE = re.compile(r"dtorch launch: (round \d|waiting for)|still running .* after SIGTERM")
NOISE = re.compile(r"Logging before InitGoogleLogging|^[WE]\d{8} .*socket\.cpp")
RANKS = re.compile(r"\brank(?:s|\(s\))? (\d+(?:(?:, | and |,)\d+)*)\b")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot(dtorch, into):
    """Copies dtorch and the libdtorch beside it into `into` (once more after 5 s if the build
    is relinking them) and returns the copy and the LD_LIBRARY_PATH it needs."""
    for attempt in (0, 1):
        try:
            os.makedirs(into, exist_ok=True)
            for lib in glob.glob(os.path.join(os.path.dirname(dtorch), "libdtorch.so*")):
                shutil.copy(lib, into)
            copy = shutil.copy(dtorch, os.path.join(into, "dtorch"))
            subprocess.run([copy, "version"], stdout=subprocess.DEVNULL, check=True,
                           env=dict(os.environ, LD_LIBRARY_PATH=into))
            return copy, into
        except (OSError, subprocess.CalledProcessError) as e:
            if attempt:
                sys.exit(f"faults: cannot copy {dtorch}: {e}")
            time.sleep(5)


class Run:
    """One training job: one `dtorch train --nproc-per-node 2` launcher, or two elastic
    launchers, writing stdout and stderr into files beside its --out folder."""

    def __init__(self, a, config, folder, resume=False):
        self.out, self.folder, self.a = os.path.join(folder, "out"), folder, a
        train = [a.exe, "train"] + CONFIGS[config] + ["--out", self.out, "--progress", "lines"]
        train += ["--resume"] if resume else []
        if config == "elastic":
            port, rid = free_port(), "faults-%d-%d" % (os.getpid(), random.randrange(10 ** 9))
            launch = [a.exe, "launch", "--nnodes", "2:3", "--nproc-per-node", "1",
                      "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:%d" % port,
                      "--rdzv-id", rid, "--rdzv-conf", "last_call_timeout=1",
                      "--max-restarts", "0", "--"]
            self.cmds = [launch + train, launch + train]
        else:
            self.cmds = [train[:2] + ["--nproc-per-node", "2"] + train[2:]]
        self.tag = "resume" if resume else "run"
        os.makedirs(folder, exist_ok=True)

    def start(self):
        env = dict(os.environ, DTORCH_TIMEOUT=str(self.a.timeout))
        self.procs = []
        for i, cmd in enumerate(self.cmds):
            base = os.path.join(self.folder, "%s%d" % (self.tag, i))
            with open(base + ".out", "w") as out, open(base + ".err", "w") as err:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env,
                                                   cwd="/tmp"))
        self.t0 = time.monotonic()
        self.ended = [None] * len(self.procs)
        return self

    def poll(self):
        """Notes when each launcher exited; True when all have."""
        for i, p in enumerate(self.procs):
            if self.ended[i] is None and p.poll() is not None:
                self.ended[i] = time.monotonic()
        return all(e is not None for e in self.ended)

    def wait(self, limit):
        deadline = time.monotonic() + limit
        while not self.poll() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.poll()

    def codes(self):
        return [p.returncode for p in self.procs]

    def stderr(self):
        """Each launcher's stderr, labelled when there are two."""
        texts = []
        for i in range(len(self.procs)):
            with open(os.path.join(self.folder, "%s%d.err" % (self.tag, i)), errors="replace") as f:
                label = "%s, launcher %d" % (self.tag, i) if len(self.procs) > 1 else self.tag
                texts.append((label, f.read()))
        return texts

    def workers(self):
        """Live processes whose parent is one of the launchers and that run as a rank (RANK in
        their environment: a child forked but not yet started as a worker has none)."""
        pids = {p.pid for p in self.procs}
        return [pid for pid, ppid, state in processes()
                if ppid in pids and state != "Z" and env_rank(pid) is not None]

    def left(self):
        """Processes other than this script whose command line holds the --out folder."""
        found = []
        for pid in proc_pids():
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if self.out.encode() in args and pid != os.getpid():
                found.append(pid)
        return found

    def kill(self):
        for pid in [p.pid for p in self.procs if p.poll() is None] + self.left():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait()


def proc_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def processes():
    """(pid, parent pid, state) of every process."""
    rows = []
    for pid in proc_pids():
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            rows.append((pid, int(fields[1]), fields[0]))
        except (OSError, IndexError, ValueError):
            pass
    return rows


def env_rank(pid):
    value = env_of(pid, "RANK")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def names_rank(texts, rank):
    for line in "\n".join(text for _, text in texts).splitlines():
        if ROUTINE.search(line):
            continue
        for m in RANKS.finditer(line):
            if rank in map(int, re.findall(r"\d+", m.group(1))):
                return True
    return False


def epochs(out):
    """The "epoch" records of out/metrics.jsonl."""
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return []
    return [r for r in rows if r.get("kind") == "epoch"]


def compare(rec, ref):
    """"bit for bit", or what differs."""
    if rec is None:
        return "no epoch record"
    diffs = []
    for k in FIELDS:
        if rec.get(k) != ref.get(k):
            try:
                diffs.append("%s %+.3g" % (k, rec.get(k) - ref.get(k)))
            except TypeError:
                diffs.append("%s %s != %s" % (k, rec.get(k), ref.get(k)))
    return "; ".join(diffs) or "bit for bit"


def tail(texts, n=8):
    """The last n lines of each stderr, without LibTorch's notices that a second launcher on
    the endpoint's host could not serve the store (it then connects to the first's)."""
    lines = []
    for label, text in texts:
        kept = [l for l in text.splitlines() if not NOISE.search(l)]
        lines += ["%s:" % label] + kept[-n:]
    return "\n".join(lines)


def reference(a, config, work):
    run = Run(a, config, os.path.join(work, config + "-ref")).start()
    if not run.wait(600) or any(run.codes()):
        run.kill()
        return None, "reference run failed (%s):\n%s" % (run.codes(), tail(run.stderr()))
    recs = epochs(run.out)
    if not recs:
        return None, "reference run wrote no epoch record"
    return (max(run.ended) - run.t0, recs[-1]), None


def shm_segments():
    return {f for f in os.listdir("/dev/shm") if f.startswith("dtorch-")}


def in_save(out):
    """Whether a checkpoint is being written in `out`: a checkpoint's temporary file (not
    config.json's or metrics.jsonl's), or a sharded checkpoint's staging folder."""
    for _, dirs, files in os.walk(out):
        if any(n.endswith(".partial") for n in dirs) or \
                any(n.startswith("checkpoint-") and n.endswith(".tmp") for n in files):
            return True
    return False


def env_of(pid, name):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(name.encode() + b"="):
                    return item[len(name) + 1:].decode()
    except OSError:
        pass
    return None


def strangers(port):
    """Two connections to the store at 127.0.0.1:port: one byte sent and held, and a SET (after
    2.x's VALIDATE, which 1.13's server reads as a SET too) announcing a 2 GiB key."""
    held, big = socket.create_connection(("127.0.0.1", port)), \
        socket.create_connection(("127.0.0.1", port))
    held.sendall(b"\0")
    big.sendall(bytes([0x00, 0xce, 0xf7, 0x85, 0x3c, 0x01]) + (1 << 31).to_bytes(8, "little"))
    return [held, big]


def libuv_store(version):
    """Whether a dtorch of LibTorch `version` serves its store with libuv (2.4+, USE_LIBUV not
    0), which serves a job around a stranger."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 4) and os.environ.get("USE_LIBUV", "1") != "0"


def wait_for_save(run, limit):
    """Polls --out every 2 ms until a checkpoint is being written; whether one was seen."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not run.poll():
        if in_save(run.out):
            return True
        time.sleep(0.002)
    return False


def trial(a, rng, config, n, ref_s, ref_rec, work):
    t = {"config": config, "n": n, "action": rng.choice(a.actions),
         "delay": rng.uniform(1.0, max(1.0, 0.9 * ref_s)), "reasons": [], "stderr": []}
    shm_before = shm_segments()
    run = Run(a, config, os.path.join(work, "%s-%d" % (config, n))).start()
    held = []
    try:
        if t["action"] == "kill-in-save":
            if not wait_for_save(run, 1.5 * ref_s + 10):
                t["finished_first"] = "no checkpoint write seen"
                return t
        else:
            run.wait(t["delay"])
        workers = [] if run.poll() else run.workers()
        while not workers and not run.poll() and time.monotonic() - run.t0 < t["delay"] + 10:
            time.sleep(0.1)  # an elastic job's workers start after the rendezvous
            workers = run.workers()
        if not workers:
            t["finished_first"] = True
            return t
        pid = rng.choice(sorted(workers))
        t["rank"], t["epochs_done"] = env_rank(pid), len(epochs(run.out))
        t["delay"] = time.monotonic() - run.t0
        action = t["action"]
        try:
            if action in ("SIGKILL", "SIGSTOP", "kill-in-save"):
                os.kill(pid, signal.SIGSTOP if action == "SIGSTOP" else signal.SIGKILL)
                expected = "non-zero"
            elif action in ("SIGTERM-launcher", "SIGUSR1-launcher"):
                launcher = rng.choice([p for p in run.procs if p.poll() is None])
                launcher.send_signal(signal.SIGTERM if action == "SIGTERM-launcher"
                                     else signal.SIGUSR1)
                expected = "non-zero" if action == "SIGTERM-launcher" else CHECKPOINTED
            else:
                held = strangers(int(env_of(pid, "MASTER_PORT")))
                expected = 0 if libuv_store(a.version) else "non-zero"
        except (ProcessLookupError, ConnectionError, TypeError, ValueError):
            t["finished_first"] = True
            return t
        sent = time.monotonic()
        limit = a.timeout + 10 + (ref_s if expected == 0 else 0)
        exited = run.wait(limit)
        if not exited and action != "stranger" and t["epochs_done"] > ref_rec["epoch"] and \
                run.workers() == [pid]:
            t["finished_first"] = "stopped after the last epoch, the other workers had exited"
            return t
        exited = exited or run.wait(HANG_S - limit)
        t["codes"] = run.codes()
        t["stderr"] = run.stderr()
        if not exited:
            t["reasons"].append("launcher still running %d s after the fault" % HANG_S)
        elif all(c == 0 for c in t["codes"]) and expected != 0:
            t["finished_first"] = True
            return t
        elif t["epochs_done"] > ref_rec["epoch"] and any(c == 0 for c in t["codes"]) and \
                expected != 0:
            # The job's work was done: the killed worker was on its way out, the others gone.
            t["finished_first"] = "killed after the last epoch, the other workers had exited"
            return t
        else:
            t["exit_s"] = max(run.ended) - sent
            want = {"non-zero": lambda c: c != 0, 0: lambda c: c == 0,
                    CHECKPOINTED: lambda c: c == CHECKPOINTED}[expected]
            if not all(want(c) for c in t["codes"]):
                t["reasons"].append("exit codes %s, not %s" % (t["codes"], expected))
            if t["exit_s"] > limit:
                t["reasons"].append("exited after %.1f s > %d s" % (t["exit_s"], limit))
        t["named"] = names_cause(t, expected)
        if not t["named"]:
            t["reasons"].append("cause not named")
        t["left"] = run.left()
        if t["left"]:
            t["reasons"].append("left behind: pids %s" % t["left"])
    finally:
        for c in held:
            c.close()
        run.kill()
    shm_left = sorted(shm_segments() - shm_before)
    if shm_left:
        t["reasons"].append("left in /dev/shm: %s" % ", ".join(shm_left))
    t["shm_left"] = shm_left
    if t["action"] == "stranger" and all(c == 0 for c in t["codes"]):
        recs = epochs(run.out)  # served around the stranger: the run itself must be right
        t["resumed"] = compare(recs[-1] if recs else None, ref_rec)
    else:
        again = Run(a, config, run.folder, resume=True).start()
        if not again.wait(600):
            again.kill()
        recs = epochs(again.out)
        t["resumed"] = compare(recs[-1] if recs else None, ref_rec)
        if any(c != 0 for c in again.codes()):
            t["resumed"] = "--resume failed (%s)" % again.codes()
            t["stderr"] += again.stderr()
    if t["resumed"] != "bit for bit":
        t["reasons"].append("result: " + t["resumed"])
    t["passed"] = not t["reasons"]
    return t


def names_cause(t, expected):
    """Whether the job's messages name what happened: the rank a worker fault hit, the
    launcher's signal, or the store that stopped answering (nothing to name where the job
    was served around the stranger)."""
    text = "\n".join(s for _, s in t["stderr"])
    if t["action"] == "SIGTERM-launcher":
        return "got SIGTERM" in text
    if t["action"] == "SIGUSR1-launcher":
        return "checkpointed on SIGUSR1" in text
    if t["action"] == "stranger":
        return expected == 0 or "has not answered" in text or "did not answer" in text
    return names_rank(t["stderr"], t["rank"])


def describe(t):
    head = "%-8s %2d %s at %5.2f s" % (t["config"], t["n"], t["action"], t["delay"])
    if t.get("finished_first"):
        why = t["finished_first"]
        return head + ": finished first (%snot counted)" % (why + "; " if why is not True else "")
    exit_ = ("exit %s after %.2f s" % ("/".join(map(str, t["codes"])), t["exit_s"])
             if "exit_s" in t else "no exit")
    return "%s -> rank %s (%d epoch(s) done): %s, %s, %s, result %s: %s" % (
        head, t["rank"], t["epochs_done"], exit_, "cause named" if t["named"] else "NOT named",
        "left %d" % (len(t["left"]) + len(t["shm_left"])) if t["left"] or t["shm_left"]
        else "nothing left", t["resumed"],
        "PASS" if t["passed"] else "FAIL (" + "; ".join(t["reasons"]) + ")")


def row(name, ts):
    """A table row over trials `ts`."""
    counted = [t for t in ts if not t.get("finished_first")]
    first = len(ts) - len(counted)
    exits = [t["exit_s"] for t in counted if "exit_s" in t]
    same = sum(t["resumed"] == "bit for bit" for t in counted)
    return "| %s | %d%s | %d | %s | %s | %d/%d | %d | %d/%d%s |" % (
        name, len(counted), " (+%d finished first)" % first if first else "",
        sum(t["passed"] for t in counted),
        "%.2f" % statistics.median(exits) if exits else "-",
        "%.2f" % max(exits) if exits else "-", sum(t["named"] for t in counted),
        len(counted), sum(bool(t["left"] or t["shm_left"]) for t in counted), same, len(counted),
        " bit for bit" if counted else "")


def table(a, results):
    header = "| %s | trials | passed | median s to exit | max s to exit | cause named | " \
             "left behind | result = reference |"
    lines = [header % "config", "|---|---|---|---|---|---|---|---|"]
    for config, ts in results.items():
        if isinstance(ts, str):
            lines.append("| %s | 0 | - | - | - | - | - | %s |" % (config, ts.splitlines()[0]))
            continue
        lines.append(row(config, ts))
    every = [t for ts in results.values() if not isinstance(ts, str) for t in ts]
    lines += ["", header % "fault", "|---|---|---|---|---|---|---|---|"]
    for action in a.actions:
        lines.append(row(action, [t for t in every if t["action"] == action]))
    failed = [t for ts in results.values() if not isinstance(ts, str) for t in ts
              if not t.get("finished_first") and not t["passed"]]
    lines += ["", "Failed trials: %s" % ("none" if not failed else len(failed))]
    for t in failed:
        lines += ["", "- %s #%d (%s at %.2f s, rank %s): %s" % (
            t["config"], t["n"], t["action"], t["delay"], t["rank"], "; ".join(t["reasons"])),
            "", "  ```", *("  " + l for l in tail(t["stderr"]).splitlines()), "  ```"]
    for config, ts in results.items():
        if isinstance(ts, str):
            lines += ["", "- %s: not run: %s" % (config, ts)]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtorch", default=os.path.join(ROOT, "build", "dtorch"))
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--actions", default=",".join(ACTIONS), help="the faults drawn from")
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    ap.add_argument("--timeout", type=int, default=10, help="DTORCH_TIMEOUT for every run")
    ap.add_argument("--markdown", help="put the table, command and machine into this file "
                    "(between its faults:start and faults:end markers)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--no-copy", action="store_true", help="run --dtorch in place")
    a = ap.parse_args()
    configs = a.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        sys.exit("faults: unknown config(s) %s (known: %s)" % (unknown, ", ".join(CONFIGS)))
    a.actions = a.actions.split(",")
    unknown = [x for x in a.actions if x not in ACTIONS]
    if unknown:
        sys.exit("faults: unknown action(s) %s (known: %s)" % (unknown, ", ".join(ACTIONS)))
    a.seed = a.seed if a.seed is not None else int(time.time()) % 100000
    rng = random.Random(a.seed)
    a.dtorch = os.path.abspath(a.dtorch)
    work = tempfile.mkdtemp(prefix="dtorch-faults-")
    a.exe = a.dtorch
    if not a.no_copy:
        a.exe, os.environ["LD_LIBRARY_PATH"] = snapshot(a.dtorch, os.path.join(work, "bin"))
    version = a.version = libtorch_version(a.exe)
    command = "bench/faults.py " + " ".join(sys.argv[1:])
    print("faults: seed %d, work folder %s, %s" % (a.seed, work, machine()), flush=True)
    started, results = time.monotonic(), {}
    for config in configs:
        got, err = reference(a, config, work)
        if err:
            print("%-8s reference: %s" % (config, err), flush=True)
            results[config] = err
            continue
        ref_s, ref_rec = got
        print("%-8s reference: %.2f s, final %s" % (
            config, ref_s, ", ".join("%s %s" % (k, ref_rec[k]) for k in FIELDS)), flush=True)
        results[config] = []
        # --trials counts trials whose fault landed; a run that finished first is drawn again,
        # up to 2 * --trials draws in all.
        n = 0
        while sum(not t.get("finished_first") for t in results[config]) < a.trials and \
                n < 2 * a.trials:
            n += 1
            t = trial(a, rng, config, n, ref_s, ref_rec, work)
            results[config].append(t)
            print(describe(t), flush=True)
    lines = table(a, results)
    print("\n" + "\n".join(lines))
    minutes = (time.monotonic() - started) / 60
    print("\nfaults: %.1f min" % minutes)
    if a.markdown:  # between the file's faults markers, or appended
        replace_block(a.markdown, "<!-- faults:start -->", "<!-- faults:end -->", "\n".join([
            "<!-- faults:start -->",
            "`%s` (seed %d), %s, on %s with %s (LibTorch %s), DTORCH_TIMEOUT=%d, %.0f min." % (
                command, a.seed, datetime.date.today().isoformat(), machine(),
                os.path.relpath(a.dtorch, ROOT), version, a.timeout, minutes), "",
            *lines, "<!-- faults:end -->"]))
    failed = any(isinstance(ts, str) or any(not t.get("finished_first") and not t["passed"]
                                            for t in ts) for ts in results.values())
    if a.keep or failed:
        print("faults: kept %s" % work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
