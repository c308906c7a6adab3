"""roles/spark_vllm_image passes no value through a shell: a ref, a name or a version with a quote cannot run commands.

Every command task uses argv (one word per value), the thin layer's Dockerfile travels on stdin with an
exec-form RUN (JSON, no shell in the build container either), and the image name that goes into its FROM
line is checked to be a plain docker reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "spark_vllm_image"
EVIL = "2.52.1\"; touch /tmp/PWNED; echo \"'$(id)'"


def tasks():
    for path in sorted((ROLE / "tasks").glob("*.yml")):
        stack = list(yaml.safe_load(path.read_text()) or [])
        while stack:
            task = stack.pop()
            stack.extend(task.get("block", []) + task.get("rescue", []) + task.get("always", []))
            yield path.name, task


def test_no_task_of_the_role_uses_a_shell():
    for name, task in tasks():
        assert not {"shell", "ansible.builtin.shell", "raw", "ansible.builtin.raw"} & set(task), (name, task["name"])
        for key in ("command", "ansible.builtin.command"):
            if key in task:
                assert isinstance(task[key], dict) and "argv" in task[key] and "cmd" not in task[key], (
                    name,
                    task["name"],
                )


def render_thin_layer(from_ref: str, have_ray, want_ray: str, source: str = "eugr") -> str:
    from ansible.template import Templar  # noqa: PLC0415

    try:  # ansible-core 2.19+: only trusted strings are templates
        from ansible._internal._datatag._tags import TrustedAsTemplate  # noqa: PLC0415

        trust = TrustedAsTemplate().tag
    except ImportError:  # pragma: no cover - older cores trust every string

        def trust(text):
            return text

    template = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["spark_vllm_image_thin_layer"]
    templar = Templar(
        variables={
            "spark_vllm_image_thin_layer_from": from_ref,
            "spark_vllm_image_thin_layer_ray": have_ray,
            "sparkops_ray_version": want_ray,
            "spark_vllm_image_source": source,
        }
    )
    return templar.template(trust(template))


def test_thin_layer_runs_pip_without_a_shell_whatever_the_version_says():
    text = render_thin_layer("vllm-node:fc08740fba1e-0123abcd-unlabelled", "2.50.0", EVIL)
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0] == "FROM vllm-node:fc08740fba1e-0123abcd-unlabelled"
    assert lines[1].startswith("RUN [")  # exec form: no /bin/sh -c
    argv = json.loads(lines[1][len("RUN ") :])
    assert argv[:3] == ["python3", "-m", "pip"] and argv[-1] == "ray[default]==" + EVIL
    assert len(lines) == 2


def test_thin_layer_without_ray_change_is_only_from():
    text = render_thin_layer("vllm-node:x", "2.52.1", "2.52.1")
    assert [line for line in text.splitlines() if line.strip()] == ["FROM vllm-node:x"]


def test_thin_layer_clears_a_registry_images_entrypoint():
    """vLLM's own image runs `vllm serve` with the container's command as its arguments (ENTRYPOINT ["vllm",
    "serve"]); sparkops' containers give the whole command, so the layer on a pulled image clears it."""
    text = render_thin_layer("vllm/vllm-openai@sha256:" + "a" * 64, "2.52.1", "2.52.1", source="registry")
    assert [line for line in text.splitlines() if line.strip()][1:] == ["ENTRYPOINT []"]
    built = render_thin_layer("vllm-node:x", "2.52.1", "2.52.1", source="eugr")
    # eugr's image keeps its own (Dockerfile@fc08740:266 sets none beyond NVIDIA's CUDA base, which runs the command
    # it is given): its layer, and so its image ID, stay as they were.
    assert "ENTRYPOINT" not in built


def test_the_image_name_check_refuses_spaces_quotes_and_newlines():
    import re

    task = next(t for _path, t in tasks() if t["name"] == "Refuse an image name that is not a plain docker reference")
    pattern = task["ansible.builtin.assert"]["that"].split("match('", 1)[1].rsplit("')", 1)[0]
    assert re.match(pattern, "vllm-node:fc08740fba1e-0123abcd")
    assert re.match(pattern, "registry.local/team/vllm-node:abc")
    for bad in ("vllm-node:a b", "vllm-node:x'y", 'vllm-node:x"y', "vllm-node:x\nRUN id", "Vllm:x", "vllm-node"):
        assert not re.match(pattern, bad), bad  # Jinja's `match` test is re.match


def test_a_new_build_loads_its_compiled_code_and_a_refused_build_is_removed():
    """issue 43: after a build, vLLM's and FlashInfer's compiled code is loaded against the image's torch, and an
    image the checks refuse is removed, so the next run builds again instead of finding and refusing it."""
    build = yaml.safe_load((ROLE / "tasks" / "build.yml").read_text())
    check = next(t for t in build if "rescue" in t and any("image_versions" in str(b) for b in t["block"]))
    modules = [next(k for k in task if k.startswith("sparkops.cluster.")) for task in check["block"] if "name" in task
               and any(k.startswith("sparkops.cluster.") for k in task)]  # fmt: skip
    assert modules == ["sparkops.cluster.image_versions", "sparkops.cluster.image_compiled"]
    compiled = next(t for t in check["block"] if "sparkops.cluster.image_compiled" in t)[
        "sparkops.cluster.image_compiled"
    ]
    assert compiled["gpus"] == "{{ sparkops_hardware == 'dgx_spark' }}"
    removed = [t["ansible.builtin.command"]["argv"] for t in check["rescue"] if "ansible.builtin.command" in t]
    assert removed == [["docker", "image", "rm", "{{ spark_vllm_image_new }}"]]
    assert any("ansible.builtin.fail" in t for t in check["rescue"])
    assert "spark_vllm_image_built.rc != 0" in check["when"]
    assert check["vars"]["spark_vllm_image_new"] == "{{ sparkops_image }}"
