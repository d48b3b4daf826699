#!/usr/bin/env python3
"""Checks the deploy recipes against the daemons' configuration table.

  check_manifests.py --print_settings=PATH --deploy_dir=DIR

- Kubernetes (DIR/k8s/*.yaml): every environment variable a container gets (env and the keys
  of envFrom ConfigMaps) is one the daemons read, or a helper that only feeds another variable
  through $(NAME); every --flag in command/args exists; the pserver StatefulSet, its headless
  Service and TESSERA_PSERVERS agree (names, replicas, port); the trainer Job is Indexed with
  completions = parallelism = TESSERA_TRAINERS and takes its trainer id from the completion
  index; and each pod's resolved environment passes the daemons' own parsing and validation
  (print_settings --check).
- Slurm (DIR/slurm/tessera.sbatch) and MPI (DIR/mpi/*.sh): the scripts run against fake Slurm /
  MPI environments and fake daemons that hand their flags to print_settings --check, so an
  unknown flag or a bad value fails here; roles, ids and endpoints are checked too.

Renaming a flag or an environment variable in common/config/cluster_config.cc makes this fail.
Prints one line per failure and exits 1 if there was any.
"""

import argparse
import glob
import os
import re
import stat
import subprocess
import sys
import tempfile

import yaml

FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print("FAIL: " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


def load_settings(print_settings):
    out = subprocess.run([print_settings], check=True, capture_output=True, text=True).stdout
    flags, envs = set(), set()
    for line in out.splitlines():
        parts = line.split()
        flags.add(parts[0][2:])
        envs.update(parts[1:])
    return flags, envs


def run_check(print_settings, role, args, env):
    """print_settings --check: (ok, output)."""
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    full_env.update(env)
    p = subprocess.run([print_settings, "--check", "--default_role=" + role] + list(args),
                       env=full_env, capture_output=True, text=True, timeout=30)
    return p.returncode == 0, (p.stdout + p.stderr).strip()


def parse_ok(line):
    """'ok role=trainer mode=... ' -> dict."""
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


# ---------------------------------------------------------------- Kubernetes

def check_k8s(k8s_dir, flags, envs, print_settings):
    docs = []
    for path in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs.append((os.path.basename(path), doc))
    check(docs, "no Kubernetes manifests in " + k8s_dir)
    by_kind = {}
    for name, doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    configmaps = by_kind.get("ConfigMap", {})
    services = by_kind.get("Service", {})
    statefulsets = by_kind.get("StatefulSet", {})
    jobs = by_kind.get("Job", {})
    check(statefulsets, "no pserver StatefulSet")
    check(jobs, "no trainer Job")

    def container_env(where, c):
        """The ConfigMap part of a container's env, and its env items (resolved per pod)."""
        env, items = {}, []
        for ref in c.get("envFrom", []):
            cm_name = ref.get("configMapRef", {}).get("name")
            if not check(cm_name in configmaps, f"{where}: envFrom ConfigMap '{cm_name}' is not "
                         "in the manifests"):
                continue
            for key, value in configmaps[cm_name].get("data", {}).items():
                check(key in envs, f"ConfigMap {cm_name}: {key} is not an environment variable "
                      "the daemons read")
                env[key] = str(value)
        for e in c.get("env", []):
            items.append(e)
        values = " ".join(str(e.get("value", "")) for e in items)
        for e in items:
            name = e["name"]
            used_as_helper = "$(" + name + ")" in values
            check(name in envs or used_as_helper,
                  f"{where}: env {name} is not an environment variable the daemons read")
        return env, items

    def resolve(items, env, fields):
        for e in items:
            if "value" in e:
                v = str(e["value"])
                v = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), v)
                env[e["name"]] = v
            else:
                path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                if check(path in fields, f"env {e['name']}: unexpected fieldRef {path}"):
                    env[e["name"]] = fields[path]
        return env

    def container_flags(where, c, binary_role):
        cmd = list(c.get("command", [])) + list(c.get("args", []))
        check(cmd and os.path.basename(cmd[0]) == "tessera_" + binary_role,
              f"{where}: command should run tessera_{binary_role}, not {cmd[:1]}")
        args = cmd[1:]
        for a in args:
            if a.startswith("--"):
                name = a[2:].split("=", 1)[0]
                check(name in flags, f"{where}: flag {a} is not a daemon flag")
        return args

    # Pservers: StatefulSet + headless Service + TESSERA_PSERVERS.
    for sts_name, sts in statefulsets.items():
        where = "StatefulSet " + sts_name
        spec = sts["spec"]
        svc_name = spec.get("serviceName")
        svc = services.get(svc_name)
        if not check(svc is not None, f"{where}: serviceName '{svc_name}' has no Service"):
            continue
        check(svc["spec"].get("clusterIP") == "None", f"Service {svc_name} is not headless")
        labels = spec["template"]["metadata"]["labels"]
        check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
              f"Service {svc_name} selector does not select the {where} pods")
        check(spec["selector"]["matchLabels"].items() <= labels.items(),
              f"{where}: selector does not match its pod labels")
        replicas = spec.get("replicas", 1)
        containers = spec["template"]["spec"]["containers"]
        for c in containers:
            cwhere = f"{where} container {c['name']}"
            env, items = container_env(cwhere, c)
            args = container_flags(cwhere, c, "pserver")
            ports = [p["containerPort"] for p in c.get("ports", [])]
            svc_ports = [p.get("targetPort", p["port"]) for p in svc["spec"]["ports"]]
            check(any(p in ports for p in svc_ports),
                  f"{cwhere}: no container port matches Service {svc_name} ports {svc_ports}")
            for i in range(replicas):
                fields = {"metadata.name": f"{sts_name}-{i}"}
                pod_env = resolve(items, dict(env), fields)
                check(pod_env.get("TESSERA_ROLE", "pserver") == "pserver",
                      f"{cwhere}: TESSERA_ROLE={pod_env.get('TESSERA_ROLE')}")
                expected = [f"{sts_name}-{k}.{svc_name}:{svc_ports[0]}" for k in range(replicas)]
                pservers = pod_env.get("TESSERA_PSERVERS", "").split(",")
                check(pservers == expected,
                      f"{cwhere}: TESSERA_PSERVERS={pod_env.get('TESSERA_PSERVERS')} but the "
                      f"StatefulSet's pods are {','.join(expected)}")
                check(pod_env.get("TESSERA_CURRENT_ENDPOINT") == expected[i],
                      f"{cwhere}: pod {i} gets TESSERA_CURRENT_ENDPOINT="
                      f"{pod_env.get('TESSERA_CURRENT_ENDPOINT')}, not {expected[i]}")
                ok, out = run_check(print_settings, "pserver", args, pod_env)
                check(ok and parse_ok(out).get("role") == "pserver",
                      f"{cwhere} pod {i}: the daemon would refuse its configuration: {out}")

    # Trainers: an Indexed Job.
    for job_name, job in jobs.items():
        where = "Job " + job_name
        spec = job["spec"]
        check(spec.get("completionMode") == "Indexed", f"{where}: completionMode is not Indexed")
        completions = spec.get("completions")
        check(spec.get("parallelism") == completions,
              f"{where}: parallelism {spec.get('parallelism')} != completions {completions}: "
              "sync training needs every trainer at once")
        for c in spec["template"]["spec"]["containers"]:
            cwhere = f"{where} container {c['name']}"
            env, items = container_env(cwhere, c)
            args = container_flags(cwhere, c, "trainer")
            ids = [e for e in items if e["name"] in ("TESSERA_TRAINER_ID", "PADDLE_TRAINER_ID")]
            check(ids and "job-completion-index" in
                  ids[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", ""),
                  f"{cwhere}: the trainer id does not come from the completion index")
            for k in range(completions or 0):
                fields = {"metadata.annotations['batch.kubernetes.io/job-completion-index']":
                          str(k), "metadata.name": f"{job_name}-{k}-x"}
                pod_env = resolve(items, dict(env), fields)
                check(pod_env.get("TESSERA_TRAINERS") == str(completions),
                      f"{cwhere}: TESSERA_TRAINERS={pod_env.get('TESSERA_TRAINERS')} but "
                      f"completions={completions}")
                ok, out = run_check(print_settings, "trainer", args, pod_env)
                if check(ok, f"{cwhere} pod {k}: the daemon would refuse its configuration: "
                         f"{out}"):
                    got = parse_ok(out)
                    check(got.get("role") == "trainer" and got.get("trainer_id") == str(k),
                          f"{cwhere} pod {k}: resolved {out}")
                    sts_pservers = set()
                    for sts_name, sts in statefulsets.items():
                        svc = sts["spec"]["serviceName"]
                        port = services[svc]["spec"]["ports"][0]["port"]
                        for i in range(sts["spec"].get("replicas", 1)):
                            sts_pservers.add(f"{sts_name}-{i}.{svc}:{port}")
                    check(set(got.get("pservers", "").split(",")) == sts_pservers,
                          f"{cwhere}: trainers use pservers {got.get('pservers')}, the "
                          f"StatefulSets run {sorted(sts_pservers)}")


# ---------------------------------------------------------------- Slurm and MPI

def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def fake_tools(tmp, print_settings):
    """Fake daemons (flags -> print_settings --check), scontrol and srun."""
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    for role in ("pserver", "trainer"):
        write_exe(os.path.join(bindir, "tessera_" + role),
                  f'#!/bin/sh\nexec "{print_settings}" --check --default_role={role} "$@"\n')
    # scontrol show hostnames "node[1-4]" -> node1..node4 (one range is enough here).
    write_exe(os.path.join(bindir, "scontrol"), r'''#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 1
if [[ "$3" =~ ^([a-z]+)\[([0-9]+)-([0-9]+)\]$ ]]; then
  for ((i = ${BASH_REMATCH[2]}; i <= ${BASH_REMATCH[3]}; i++)); do echo "${BASH_REMATCH[1]}$i"; done
else
  echo "$3" | tr ',' '\n'
fi
''')
    write_exe(os.path.join(bindir, "srun"), '#!/bin/sh\necho "srun $*"\n')
    return bindir


def run_script(argv, env, bindir):
    full_env = {"PATH": bindir + ":" + os.environ.get("PATH", "/usr/bin:/bin")}
    full_env.update(env)
    p = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=60)
    return p.returncode, (p.stdout + p.stderr).strip()


def check_slurm(deploy_dir, bindir):
    script = os.path.join(deploy_dir, "slurm", "tessera.sbatch")
    home = os.path.dirname(deploy_dir)

    def task(procid, ntasks, nodelist, extra_env=None):
        env = {"TESSERA_SLURM_TASK": "1", "TESSERA_HOME": home, "SLURM_PROCID": str(procid),
               "SLURM_NTASKS": str(ntasks), "SLURM_JOB_NODELIST": nodelist,
               "SLURM_JOB_ID": "42", "TESSERA_SLURM_BIN_DIR": bindir}
        env.update(extra_env or {})
        code, out = run_script(["bash", script, "--example=mlp_regression", "--epochs=2"], env,
                               bindir)
        if not check(code == 0 and out.startswith("ok "),
                     f"tessera.sbatch task {procid}/{ntasks} on {nodelist}: {out}"):
            return {}
        return parse_ok(out.splitlines()[-1])

    # 4 nodes, one task each: 2 pservers (the default, half), 2 trainers.
    want_ps = "node1:6170,node2:6170"
    for procid, role, tid, ep in [(0, "pserver", "0", "node1:6170"),
                                  (1, "pserver", "0", "node2:6170"),
                                  (2, "trainer", "0", ""), (3, "trainer", "1", "")]:
        got = task(procid, 4, "node[1-4]")
        if got:
            check(got.get("role") == role and got.get("pservers") == want_ps and
                  got.get("trainers") == "2" and got.get("trainer_id") == tid and
                  got.get("current_endpoint") == ep and got.get("job_id") == "slurm-42" and
                  got.get("example") == "mlp_regression",
                  f"tessera.sbatch task {procid} of 4: {got}")
    # 2 nodes, 2 tasks each, one pserver: task 3 is on node2 and is trainer 2 of 3.
    got = task(3, 4, "node[1-2]", {"TESSERA_SLURM_PSERVERS": "1", "TESSERA_SLURM_PORT": "7000"})
    check(got.get("role") == "trainer" and got.get("trainer_id") == "2" and
          got.get("trainers") == "3" and got.get("pservers") == "node1:7000",
          f"tessera.sbatch 2 tasks per node, task 3: {got}")
    got = task(0, 4, "node[1-2]", {"TESSERA_SLURM_PSERVERS": "2"})
    check(got.get("current_endpoint") == "node1:6170" and
          got.get("pservers") == "node1:6170,node1:6171",
          f"tessera.sbatch 2 tasks per node, task 0: {got}")
    # Bad layouts are refused with a message.
    code, out = run_script(["bash", script], {
        "TESSERA_SLURM_TASK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "3",
        "SLURM_JOB_NODELIST": "node[1-2]", "TESSERA_SLURM_BIN_DIR": bindir}, bindir)
    check(code == 2 and "evenly" in out, f"tessera.sbatch with 3 tasks on 2 nodes: {code} {out}")
    # The batch step starts one copy per task through srun.
    code, out = run_script(["bash", script, "--example=ctr"], {"TESSERA_HOME": home}, bindir)
    check(code == 0 and out.startswith("srun --kill-on-bad-exit=1") and
          out.endswith(f"bash {script} --example=ctr"), f"tessera.sbatch batch step: {out}")


def check_mpi(deploy_dir, bindir, tmp):
    mpirun = os.path.join(deploy_dir, "mpi", "tessera_mpirun.sh")
    task_sh = os.path.join(deploy_dir, "mpi", "tessera_mpi_task.sh")
    code, out = run_script(["bash", mpirun, "-np", "3", "--dry-run", "--", "--example=ctr"], {},
                           bindir)
    out = out.replace("\\", "")  # printed with printf %q
    eps = "127.0.0.1:6170,127.0.0.1:6171,127.0.0.1:6172"
    check(code == 0 and out.startswith("mpirun -np 3 ") and
          f"TESSERA_MPI_ENDPOINTS={eps}" in out and out.rstrip().endswith(
              "tessera_mpi_task.sh --example=ctr"), f"tessera_mpirun.sh --dry-run: {out}")
    hostfile = os.path.join(tmp, "hosts")
    with open(hostfile, "w") as f:
        f.write("# hosts\nhostA slots=8\n\nhostB\n")
    code, out = run_script(["bash", mpirun, "-np", "2", "--hostfile", hostfile, "--dry-run"], {},
                           bindir)
    out = out.replace("\\", "")
    check(code == 0 and "--map-by ppr:1:node" in out and
          "TESSERA_MPI_ENDPOINTS=hostA:6170,hostB:6170" in out,
          f"tessera_mpirun.sh --hostfile --dry-run: {out}")
    code, out = run_script(["bash", mpirun, "-np", "3", "--hostfile", hostfile, "--dry-run"], {},
                           bindir)
    check(code == 2, f"tessera_mpirun.sh with more ranks than hosts: {code} {out}")
    code, out = run_script(["bash", mpirun, "-np", "2", "--endpoints", "h1:7000,h2:7001",
                            "--dry-run"], {}, bindir)
    out = out.replace("\\", "")
    check(code == 0 and "--bind-to socket" in out and
          "TESSERA_MPI_ENDPOINTS=h1:7000,h2:7001" in out,
          f"tessera_mpirun.sh --endpoints --dry-run (binds to sockets by default): {out}")
    code, out = run_script(["bash", mpirun, "-np", "3", "--endpoints", "h1:7000", "--dry-run"],
                           {}, bindir)
    check(code == 2 and "lists 1 endpoints for -np 3" in out,
          f"tessera_mpirun.sh with too few --endpoints: {code} {out}")
    for rank in range(3):
        code, out = run_script(["bash", task_sh, "--example=mlp_regression"], {
            "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "3",
            "TESSERA_MPI_ENDPOINTS": eps, "TESSERA_MPI_JOB_ID": "mpi-x-1",
            "TESSERA_MPI_BIN_DIR": bindir}, bindir)
        if check(code == 0 and out.startswith("ok "), f"tessera_mpi_task.sh rank {rank}: {out}"):
            got = parse_ok(out)
            check(got.get("role") == "trainer" and got.get("mode") == "collective" and
                  got.get("trainer_id") == str(rank) and got.get("trainers") == "3" and
                  got.get("trainer_endpoints") == eps and
                  got.get("current_endpoint") == eps.split(",")[rank] and
                  got.get("pservers") == "" and got.get("job_id") == "mpi-x-1",
                  f"tessera_mpi_task.sh rank {rank}: {got}")
    code, out = run_script(["bash", task_sh], {"TESSERA_MPI_BIN_DIR": bindir}, bindir)
    check(code == 2 and "mpirun" in out, f"tessera_mpi_task.sh outside MPI: {code} {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--print_settings", required=True)
    ap.add_argument("--deploy_dir", required=True)
    a = ap.parse_args()
    print_settings = os.path.abspath(a.print_settings)
    deploy_dir = os.path.abspath(a.deploy_dir)
    flags, envs = load_settings(print_settings)
    check({"role", "pservers", "trainers", "trainer_id", "current_endpoint"} <= flags,
          f"print_settings lists {sorted(flags)}")
    # The checker must be able to fail: an unknown flag is refused by the daemons' parser.
    ok, out = run_check(print_settings, "trainer", ["--pservers=a:1", "--no_such_flag=1"], {})
    check(not ok and "no_such_flag" in out, f"print_settings --check accepted a bad flag: {out}")
    check_k8s(os.path.join(deploy_dir, "k8s"), flags, envs, print_settings)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        bindir = fake_tools(tmp, print_settings)
        check_slurm(deploy_dir, bindir)
        check_mpi(deploy_dir, bindir, tmp)
    if FAILURES:
        print(f"{len(FAILURES)} problem(s)")
        return 1
    print("deploy recipes agree with the daemons' settings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
