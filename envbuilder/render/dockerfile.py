"""Plan -> Dockerfile (BuildKit: secrets and bind mounts keep the CA bundle and wheels out of
every layer)."""

from __future__ import annotations

from ..plan.image import Copy, Plan, Step
from ..quoting import docker_comment, docker_value, image_ref, one_line
from .common import WHEELHOUSE, export_line, header, network_setup, shell_join

SHELL = 'SHELL ["/bin/bash", "-o", "pipefail", "-c"]'


def _step(step: Step) -> list[str]:
    lines = [f"# {step.component}: {docker_comment(step.title)}"]
    lines += [f"#   {docker_comment(n)}" for n in step.notes]
    if step.build_env:
        lines.append("# build flags (this step only): " + " ".join(f"{k}={docker_comment(v)}" for k, v in step.build_env.items()))
    commands = [one_line(c, f"{step.component} step") for c in step.commands]
    if step.build_env:
        commands = [export_line(step.build_env)] + commands
    mounts = [f"--mount=type=bind,source={m},target=/{m}" for m in step.mounts]
    if step.network:
        commands = network_setup() + commands
        mounts = ["--mount=type=secret,id=ca", "--mount=type=secret,id=netrc",
                  f"--mount=type=bind,source=wheelhouse,target={WHEELHOUSE}"] + mounts
    if mounts:
        lines.append("RUN " + " \\\n    ".join(mounts) + " \\\n    " + shell_join(commands))
    else:
        lines.append("RUN " + shell_join(commands))
    return lines


def _copy(copy: Copy) -> list[str]:
    stage = _rest_stage(copy) if copy.without else copy.from_stage
    src = f"--from={stage} " if stage else ""
    return [f"COPY {src}{copy.source} {copy.dest}"]


def _rest_stage(copy: Copy) -> str:
    return f"{copy.from_stage}-rest"


def _rest_stages(stage) -> list[list[str]]:
    """A Copy that leaves paths out (earlier Copies bring them as layers of their own) copies from
    a stage of its own: the source stage with those paths deleted (whiteouts: no data is copied).
    Docker 20.10 has no COPY --exclude (BuildKit's needs the 1.7-labs frontend image)."""
    out = []
    for copy in (i for i in stage.items if isinstance(i, Copy) and i.without):
        out.append([f"FROM {copy.from_stage} AS {_rest_stage(copy)}", SHELL, "",
                    "RUN " + shell_join([f"rm -rf {p}" for p in copy.without])])
    return out


def render_dockerfile(plan: Plan, spec_sha: str) -> str:
    out = header("#", f"Dockerfile for {plan.name}", spec_sha, [
        "",
        "Build (BuildKit; the CA secret only behind a TLS-intercepting proxy):",
        f"  DOCKER_BUILDKIT=1 docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t envbuilder/{plan.name} .",
        "Local wheels (offline sites) go in ./wheelhouse/; they are bind-mounted, never copied into a layer.",
    ])
    multi = len(plan.stages) > 1
    # another architecture than x86_64: BuildKit takes a multi-arch base's (or a pulled platform
    # manifest's) image for that platform, where it would otherwise want the build machine's own
    platform = f"--platform={plan.platform} " if plan.platform else ""
    n = 0
    for stage in plan.stages:
        last = stage is plan.final
        for rest in _rest_stages(stage):
            n += 1
            name = rest[0].split()[-1]
            out += ["", f"# ---- stage {n}: {name} (the venv less what the runtime copies as layers of its own) "
                    + "-" * 10] + rest
        n += 1
        out.append("")
        role = stage.role or (("compilers and headers; only its results are copied on" if not last
                               else "what runs: no compilers, no build caches") if multi else "single stage")
        out.append(f"# ---- stage {n}: {stage.name} ({role}) " + "-" * 10)
        if platform:     # the spec's arch, on purpose: the image is for another machine than this one
            out.append("# hadolint ignore=DL3029")
        out.append(f"FROM {platform}{image_ref(stage.base)} AS {stage.name}")
        out.append(SHELL)
        for item in stage.items:
            out.append("")
            out.extend(_step(item) if isinstance(item, Step) else _copy(item))
    out.append("")
    out.append("# ---- image metadata and environment " + "-" * 10)
    out.append("LABEL " + " \\\n      ".join(f"{k}={docker_value(v, k)}" for k, v in plan.labels.items()))
    out += [f"# {k}: {why}" for k, why in plan.env_notes.items()]
    out.append("ENV " + " \\\n    ".join(f"{k}={docker_value(v, k, expand=k not in plan.literal_env)}"
                                         for k, v in plan.env.items()))
    out.append(f"WORKDIR {plan.workdir}")
    out.append(f"CMD {_json_list(plan.runscript)}")
    return "\n".join(out) + "\n"


def _json_list(items: list[str]) -> str:
    import json

    return json.dumps(items)
