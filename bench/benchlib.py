"""What the benchmark scripts share: the machine's name, running a dtorch or peer command for its
JSON result, paths as a reader's checkout has them, and rewriting one marked block of
BENCHMARKS.md (or docs/plan-benchmarks.md) while leaving the others' blocks alone."""
import json
import os
import platform
import re
import subprocess
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine():
    """What a table's figures were measured on, as "Intel(R) Xeon(R) Processor, 2 cores"."""
    name = platform.processor()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return "%s, %d cores" % (name, os.cpu_count())


def shown_path(path):
    """A path as the reader's checkout would have it: relative to the repository when inside,
    else its last part ("python3"), as no other machine has this one's directories."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return os.path.basename(path) if rel.startswith("..") else rel


def shown_args(args):
    """A command line's arguments with each path made as shown_path makes it (flag=PATH too)."""
    def one(v):
        flag, eq, value = v.rpartition("=") if v.startswith("--") else ("", "", v)
        return flag + eq + (shown_path(value) if os.path.isabs(value) else value)
    return [one(v) for v in args]


def parse_with_peer(ap):
    """Adds the arguments of the scripts that compare with bench/peer_sharded.py (--out,
    --python2, --peer), parses them, and makes --dtorch absolute."""
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    ap.add_argument("--python2", default=venv_python if os.path.exists(venv_python) else None,
                    help="Python with PyTorch 2.x (and DeepSpeed) for the peers (default "
                    ".venv/bin/python when it exists, else the peers are left out)")
    ap.add_argument("--peer", default=os.path.join(ROOT, "bench", "peer_sharded.py"))
    a = ap.parse_args()
    a.dtorch = os.path.abspath(a.dtorch)
    return a


def run_json(cmd, env=None):
    """Runs cmd from /tmp and returns the last JSON object it printed on stdout (launcher prefix
    removed); exits naming the command when it fails or prints none."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp",
                       env=dict(os.environ, **(env or {})))
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    for line in reversed(p.stdout.splitlines()):
        line = re.sub(r"^\[n\d+ r\d+\] ", "", line.strip())
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"bench: no JSON line from {' '.join(cmd)}:\n{p.stdout[-2000:]}")


def libtorch_version(dtorch):
    """The LibTorch version `dtorch version` reports ("2.15.0"), or "?"."""
    out = subprocess.run([dtorch, "version"], stdout=subprocess.PIPE, text=True).stdout
    return next((l.split()[1] for l in out.splitlines() if l.startswith("LibTorch")), "?")


def publish(path, lines):
    """Puts the block `lines` (its first line the start marker, its last the end marker) into
    the file at `path`, in place of the block between the same markers, and prints it. Paths
    into this checkout (a peer's error, say) lose their machine-specific prefix."""
    block = "\n".join(lines).replace(ROOT + os.sep, "")
    replace_block(path, lines[0], lines[-1], block)
    print(block)


def replace_block(path, start, end, block):
    """Puts `block` (which begins with `start` and ends with `end`) in place of the file's block
    between those markers, or appends it when the file has none."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def torchrun_self(script, nproc, threads):
    """Starts `nproc` ranks of `script` (a peer run as a plain command) under torchrun with this
    command line's arguments, --nproc left out (torchrun would take it for its own ambiguous
    --nproc-per-node); returns torchrun's exit code."""
    args, skip = [], False
    for v in sys.argv[1:]:
        if skip or v == "--nproc" or v.startswith("--nproc="):
            skip = v == "--nproc"
            continue
        args.append(v)
    return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", str(nproc), os.path.abspath(script)] + args,
                           env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
