"""The deployment examples in ``deploy/`` as a user copies them: the systemd unit and its node
drop-in pass ``systemd-analyze verify``, every config they embed loads with snapops's own
loader, and each multi-node sidecar's shell names its node and ranks as the protocol expects."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from snapops.config.loader import load_config
from snapops.daemon.ranks import Cluster

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SNAPOPS = str(Path(sys.executable).with_name("snapops"))


def unit_environment(text: str) -> dict[str, str]:
    """``Environment=K=V`` lines of a systemd unit or drop-in."""
    return dict(m.groups() for m in re.finditer(r"^Environment=([A-Z_]+)=(\S*)$", text, re.M))


def commented_toml(text: str) -> str:
    """The TOML a drop-in's comment tells the user to put in snapops.toml."""
    lines = text.split("# in /etc/snapops/snapops.toml on every machine:\n", 1)[1]
    return "".join(line[4:] + "\n" for line in lines.splitlines() if line.startswith("#   "))


def test_systemd_unit_and_node_dropin_verify_clean(tmp_path):
    units = tmp_path / "units"
    (units / "snapops.service.d").mkdir(parents=True)
    unit = (DEPLOY / "systemd" / "snapops.service").read_text()
    assert "ExecStart=/opt/snapops/.venv/bin/snapops daemon run" in unit
    (units / "snapops.service").write_text(unit.replace("/opt/snapops/.venv/bin/snapops",
                                                        SNAPOPS))
    shutil.copy(DEPLOY / "systemd" / "node.conf", units / "snapops.service.d" / "node.conf")
    done = subprocess.run(["systemd-analyze", "verify", "snapops.service"], cwd=units,
                          env=dict(os.environ, SYSTEMD_UNIT_PATH=f"{units}:"),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")


def test_systemd_node_dropin_makes_node_1_a_contributor_of_ranks_4_to_7(tmp_path):
    dropin = (DEPLOY / "systemd" / "node.conf").read_text()
    # what the drop-in says every machine shares besides [cluster]
    shared = ('[seal]\nhmac_key = "/etc/snapops/keys/hmac.key"\n'
              '[[repo.remote]]\nname = "origin"\nurl = "ssh://git@git.example/s.git"\n')
    (tmp_path / "snapops.toml").write_text(commented_toml(dropin) + shared)
    config = load_config(tmp_path / "snapops.toml", env=unit_environment(dropin))
    cluster = Cluster.from_config(config)
    assert (cluster.node, cluster.local, cluster.committer) == ("node-1", frozenset(range(4, 8)),
                                                                False)
    unit = unit_environment((DEPLOY / "systemd" / "snapops.service").read_text())
    assert load_config(None, env=unit).daemon.log_format == "json"


def k8s_documents(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()))


def embedded_config(documents: list[dict], tmp_path: Path) -> Path:
    (config_map,) = [d for d in documents if d["kind"] == "ConfigMap"]
    path = tmp_path / "snapops.toml"
    path.write_text(config_map["data"]["snapops.toml"])
    return path


def sidecar(documents: list[dict]) -> dict:
    for doc in documents:
        spec = doc.get("spec", {})
        spec = spec.get("template", {}).get("spec", spec)
        for container in spec.get("containers", []):
            if container["name"] == "snapops":
                return container
    raise AssertionError("no snapops container")


def test_k8s_sidecar_config_loads_and_its_probe_is_the_status_command(tmp_path):
    documents = k8s_documents("sidecar.yaml")
    config = load_config(embedded_config(documents, tmp_path), env={})
    assert (config.snapshot.run, config.repo.remotes[0].name) == ("exp-42", "origin")
    assert config.daemon.spool_dir == "/snapshots/spool"
    probe = sidecar(documents)["livenessProbe"]["exec"]["command"]
    assert probe == ["snapops", "daemon", "status", "--config", "/etc/snapops/snapops.toml"]


@pytest.mark.parametrize(("index", "ranks", "committer"), [(0, range(0, 4), True),
                                                            (1, range(4, 8), False)])
def test_k8s_multinode_pod_names_its_node_and_ranks(tmp_path, index, ranks, committer):
    """The sidecar's own shell, run by sh with the pod's completion index, up to its exec."""
    documents = k8s_documents("multinode.yaml")
    container = sidecar(documents)
    assert container["command"] == ["sh", "-c"]
    (script,) = container["args"]
    launch = "exec snapops daemon run --config /etc/snapops/snapops.toml"
    assert script.endswith(launch)
    done = subprocess.run(["sh", "-c", script[:-len(launch)] + "exec env"],
                          env={"PATH": os.environ["PATH"], "JOB_COMPLETION_INDEX": str(index)},
                          capture_output=True, text=True, check=True, timeout=30)
    env = dict(line.split("=", 1) for line in done.stdout.splitlines()
               if line.startswith("SNAPOPS_"))
    cluster = Cluster.from_config(load_config(embedded_config(documents, tmp_path), env=env))
    assert (cluster.node, cluster.local, cluster.committer) == (f"node-{index}",
                                                                frozenset(ranks), committer)
    assert cluster.multi_node and cluster.world == 8
