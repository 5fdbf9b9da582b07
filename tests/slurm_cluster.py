"""A real SLURM cluster on this machine for tests/test_slurm.py: munged, slurmctld and two slurmd daemons
(nodes n1 and n2, one CPU each, both on this host with their own ports), started from Debian's slurm-wlm
and munge with a generated slurm.conf whose state, spool, logs and munge key all live in one temporary
folder. stop() cancels what is left, stops every daemon by its pid and deletes the folder.

    cluster = Cluster().start()        # ~5 s; cluster.env has SLURM_CONF for sbatch, squeue, scontrol
    ...
    cluster.stop()

Two one-CPU nodes let a 2-node run be two torchrun agents on this machine, and cap a sweep at two runs at
once on the 2-core CI machine. Daemons run at nice 19, so their jobs do too (PropagatePrioProcess=0).
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NODES = ("n1", "n2")
# cred_expire is also how long a requeued job waits before it may start again (120 s by default: two
# minutes of an idle test per requeue); sched_interval: the builtin scheduler looks at pending jobs every
# second instead of every minute, so a requeued job starts when that wait is over.
SLURM_CONF = """\
ClusterName=nanoloop-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/socket,cred_expire=10
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=20
MinJobAge=600
{nodes}
PartitionName=test Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One controller and len(NODES) one-CPU nodes on this host; env: the environment their clients need."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # short: munge's socket path is limited
        self.env = dict(os.environ, SLURM_CONF=str(self.root / "slurm.conf"))
        self.daemons = []  # Popen objects, each in the foreground: we own their pids

    def start(self):
        for sub in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
            (self.root / sub).mkdir(parents=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.write_conf()
        munge = self.root / "munge"
        self.daemon("munged", "--foreground", "--force", f"--socket={munge}/socket", f"--key-file={key}",
                    f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log", f"--seed-file={munge}/seed")
        self.wait_for(lambda: (munge / "socket").exists(), "munged's socket")
        conf = self.env["SLURM_CONF"]
        self.daemon("slurmctld", "-D", "-f", conf)
        for node in NODES:
            self.daemon("slurmd", "-D", "-f", conf, "-N", node)
        self.wait_for(self.nodes_idle, f"nodes {', '.join(NODES)} idle (logs in {self.root / 'log'})")
        return self

    def write_conf(self):
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=1 "
                          f"State=UNKNOWN" for n in NODES)
        text = SLURM_CONF.format(host=host, root=self.root, ctld_port=free_port(), nodes=nodes,
                                 node_list=",".join(NODES))
        (self.root / "slurm.conf").write_text(text)

    def daemon(self, *argv):
        log = open(self.root / "log" / f"{argv[0]}-{len(self.daemons)}.out", "w")
        self.daemons.append(subprocess.Popen(["nice", "-n", "19", *argv], stdout=log, stderr=subprocess.STDOUT,
                                             env=self.env, start_new_session=True))

    def nodes_idle(self):
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        return out.count("idle") == len(NODES)

    def wait_for(self, condition, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not condition():
            for proc in self.daemons:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[3]} exited with {proc.returncode}; see {self.root / 'log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {what}")
            time.sleep(0.2)

    def run(self, *argv, check=True):
        """A SLURM client command (sbatch, squeue, scontrol, ...) against this cluster."""
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def queue_empty(self):
        return not self.run("squeue", "-h", check=False).stdout.strip()

    def stop(self):
        """Cancel every job, wait until no job step is left, stop the daemons by pid, delete the folder."""
        try:
            if self.daemons and self.daemons[1].poll() is None:
                self.run("scancel", "--user=root", check=False)
                self.wait_for(self.queue_empty, "the queue to empty after scancel", timeout=60)
        finally:
            for proc in reversed(self.daemons):  # the slurmds, then the controller, then munged
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            shutil.rmtree(self.root, ignore_errors=True)
        # A job's slurmstepd outlives the slurmd that started it by a moment (its parent reaps it).
        deadline = time.monotonic() + 60
        while job_steps() and time.monotonic() < deadline:
            time.sleep(0.2)


def job_steps():
    """The slurmstepd processes on this machine (`pgrep -a` lines), exited ones not yet reaped included."""
    return subprocess.run(["pgrep", "-a", "slurmstepd"], capture_output=True, text=True).stdout.strip()
