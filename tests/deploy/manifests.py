#!/usr/bin/env python3
"""Helpers of tests/deploy/run.sh for Kubernetes manifests.

    manifests.py compare PLAIN RENDERED
        PLAIN: deploy/k8s (a directory of .yaml) or a file; RENDERED: the output
        of `helm template`. Exit 0 when both hold the same objects (kind, name)
        and each pair is equal once normalised; else print a diff, exit 1.
        Normalised: YAML parsed; the labels only Helm sets (helm.sh/chart,
        app.kubernetes.io/managed-by) and the pod annotation checksum/config
        removed; a ConfigMap's *.yaml values parsed, so the idemproxy config is
        compared as data, not text.

    manifests.py consistency PATH
        Check that the pieces of the sidecar Deployment(s) in PATH fit together:
        idemproxy is a native sidecar (initContainer, restartPolicy: Always)
        with requests and limits; its config (the ConfigMap mounted where -c
        points) listens on 0.0.0.0:<the metrics containerPort>, the probes GET
        /readyz there, liveness and startup run `idemproxy health -c CONFIG`,
        and the scrape annotations name that port;
        terminationGracePeriodSeconds exceeds shutdown_grace_ms; password_file
        and redis.tls's ca_file, cert_file and key_file lie in a Secret volume
        mounted readOnly (and among its items, if it lists some); the ipc endpoint lies in an emptyDir mounted in
        idemproxy and in every app container, whose IDEMPROXY_ENDPOINT (if set)
        is that endpoint; the pod has an fsGroup (the socket is mode 0660); a
        PodDisruptionBudget selects the pods; every volumeMount of every
        container names a volume of the pod (the API server rejects it otherwise).

    manifests.py sidecar A B
        The idemproxy sidecar of the one Deployment in A and in B is the same:
        the idemproxy initContainer, the pod volumes it mounts (a ConfigMap's
        name without kustomize's hash suffix), the app containers'
        IDEMPROXY_ENDPOINT and socket mount, the pod's fsGroup and prometheus.io
        annotations. Exit 0 when equal; else print a diff, exit 1.

    manifests.py config FILE OUT [NAME]
        Write the idemproxy.yaml of the ConfigMap NAME (default: the only
        ConfigMap with an idemproxy.yaml key) found in FILE or a directory to OUT.
"""

import difflib
import glob
import os
import re
import sys

import yaml

HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
HELM_ONLY_POD_ANNOTATIONS = ("checksum/config",)


def load(path):
    files = sorted(glob.glob(os.path.join(path, "*.yaml"))) if os.path.isdir(path) else [path]
    objs = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for doc in yaml.safe_load_all(fh):
                if doc:
                    objs.append(doc)
    return objs


def key(obj):
    return (obj.get("apiVersion"), obj.get("kind"), (obj.get("metadata") or {}).get("name"))


def _strip(meta, labels=(), annotations=()):
    if not isinstance(meta, dict):
        return
    for field, names in (("labels", labels), ("annotations", annotations)):
        d = meta.get(field)
        if isinstance(d, dict):
            for n in names:
                d.pop(n, None)
            if not d:
                meta.pop(field)


def normalise(obj):
    _strip(obj.get("metadata"), HELM_ONLY_LABELS)
    spec = obj.get("spec") or {}
    template = spec.get("template") if isinstance(spec, dict) else None
    if isinstance(template, dict):
        _strip(template.get("metadata"), HELM_ONLY_LABELS, HELM_ONLY_POD_ANNOTATIONS)
    if obj.get("kind") == "ConfigMap":
        for k, v in list((obj.get("data") or {}).items()):
            if k.endswith((".yaml", ".yml")) and isinstance(v, str):
                obj["data"][k] = yaml.safe_load(v)
    return obj


def dump(obj):
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False).splitlines()


def compare(plain_path, rendered_path):
    plain = {key(o): normalise(o) for o in load(plain_path)}
    rendered_raw = load(rendered_path)
    rendered = {key(o): o for o in rendered_raw}
    ok = True
    for k in sorted(set(plain) | set(rendered), key=str):
        if k not in rendered:
            print(f"only in {plain_path}: {k[1]}/{k[2]}")
            ok = False
        elif k not in plain:
            print(f"only in the chart: {k[1]}/{k[2]}")
            ok = False
    for obj in rendered_raw:
        if obj.get("kind") == "Deployment":
            ann = ((obj.get("spec") or {}).get("template", {}).get("metadata") or {}).get("annotations") or {}
            if "checksum/config" not in ann:
                print(f"the chart's Deployment {key(obj)[2]} has no checksum/config annotation "
                      "(pods would not roll when the config changes)")
                ok = False
    for k in sorted(set(plain) & set(rendered), key=str):
        a, b = plain[k], normalise(rendered[k])
        if a != b:
            ok = False
            print(f"{k[1]}/{k[2]} differs:")
            for line in difflib.unified_diff(dump(a), dump(b), plain_path, "chart", lineterm="", n=2):
                print("    " + line)
        else:
            print(f"same {k[1]}/{k[2]}")
    return 0 if ok else 1


def _mount_volume(container, volumes, directory):
    for m in container.get("volumeMounts") or []:
        if m.get("mountPath", "").rstrip("/") == directory.rstrip("/"):
            return volumes.get(m.get("name"))
    return None


def _probe(c, kind):
    return ((c.get(kind) or {}).get("httpGet") or {})


def consistency(path):
    objs = load(path)
    problems = []
    deployments = [o for o in objs if o.get("kind") == "Deployment"]
    if not deployments:
        problems.append("no Deployment")
    for d in deployments:
        name = d["metadata"]["name"]
        pod = d["spec"]["template"]
        spec = pod["spec"]
        say = lambda msg: problems.append(f"Deployment {name}: {msg}")  # noqa: E731
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        sidecars = [c for c in spec.get("initContainers") or [] if c.get("name") == "idemproxy"]
        if len(sidecars) != 1:
            say("no initContainer named idemproxy")
            continue
        px = sidecars[0]
        if px.get("restartPolicy") != "Always":
            say("the idemproxy initContainer is not a native sidecar (restartPolicy: Always)")
        res = px.get("resources") or {}
        for part in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if r not in (res.get(part) or {}):
                    say(f"idemproxy has no {part}.{r}")
        args = (px.get("command") or []) + (px.get("args") or [])
        cfg_path = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-c", "--config")), None)
        if cfg_path is None:
            say("idemproxy is started without -c FILE")
            continue
        vol = _mount_volume(px, volumes, os.path.dirname(cfg_path))
        cms = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "ConfigMap"}
        if not vol or "configMap" not in vol or vol["configMap"].get("name") not in cms:
            say(f"{cfg_path} is not in a ConfigMap of {path}")
            continue
        text = (cms[vol["configMap"]["name"]].get("data") or {}).get(os.path.basename(cfg_path))
        if text is None:
            say(f"the ConfigMap has no key {os.path.basename(cfg_path)}")
            continue
        cfg = yaml.safe_load(text) or {}
        # metrics and probes
        listen = str((cfg.get("metrics") or {}).get("listen", "127.0.0.1:9464"))
        host, _, port = listen.rpartition(":")
        if host != "0.0.0.0":
            say(f"metrics.listen {listen}: the kubelet and Prometheus need 0.0.0.0")
        ports = {p.get("name"): p.get("containerPort") for p in px.get("ports") or []}
        if str(ports.get("metrics")) != port:
            say(f"containerPort 'metrics' is {ports.get('metrics')}, metrics.listen port {port}")
        # Liveness and startup run `idemproxy health -c CONFIG` in the container (it
        # comes from loopback, which no other pod can crowd out); readiness GETs /readyz.
        for kind in ("livenessProbe", "startupProbe"):
            if kind == "startupProbe" and not px.get(kind):
                continue
            cmd = ((px.get(kind) or {}).get("exec") or {}).get("command") or []
            if not (cmd and cmd[0].endswith("idemproxy") and cmd[1:] == ["health", "-c", cfg_path]):
                say(f"{kind} does not run idemproxy health -c {cfg_path}: {cmd!r}")
        for kind, want in (("readinessProbe", "/readyz"),):
            g = _probe(px, kind)
            if g.get("path") != want:
                say(f"{kind} GETs {g.get('path')!r}, want {want}")
            if g.get("port") not in ("metrics", int(port) if port.isdigit() else None):
                say(f"{kind} port {g.get('port')!r} is not the metrics port")
        ann = pod.get("metadata", {}).get("annotations") or {}
        if "prometheus.io/port" in ann and ann["prometheus.io/port"] != port:
            say(f"prometheus.io/port {ann['prometheus.io/port']} is not the metrics port {port}")
        # shutdown
        grace_ms = int(cfg.get("shutdown_grace_ms", 10000))
        tgps = int(spec.get("terminationGracePeriodSeconds", 30))
        if tgps * 1000 <= grace_ms:
            say(f"terminationGracePeriodSeconds {tgps} does not exceed shutdown_grace_ms {grace_ms}")
        # the password and the TLS files
        redis = cfg.get("redis") or {}
        files = [("password_file", redis.get("password_file")),
                 ("sentinel.password_file", (redis.get("sentinel") or {}).get("password_file"))]
        files += [(f"tls.{k}", (redis.get("tls") or {}).get(k)) for k in ("ca_file", "cert_file", "key_file")]
        for what, f in files:
            if not f:
                continue
            vol = _mount_volume(px, volumes, os.path.dirname(f))
            if not vol or "secret" not in vol:
                say(f"{what} {f} is not in a Secret volume")
            else:
                items = vol["secret"].get("items")
                if items and os.path.basename(f) not in [i.get("path") for i in items]:
                    say(f"the Secret volume {vol['name']} has no item with path {os.path.basename(f)} ({what})")
                if not next((m for m in px.get("volumeMounts") or [] if m.get("name") == vol["name"]), {}).get("readOnly"):
                    say(f"the Secret volume {vol['name']} ({what}) is not mounted readOnly")
        # endpoint
        endpoint = (cfg.get("app") or {}).get("endpoint", "ipc:///tmp/idemproxy.sock")
        if not endpoint.startswith("ipc://"):
            say(f"app.endpoint {endpoint}: want ipc:// on the shared emptyDir")
        else:
            sock_dir = os.path.dirname(endpoint[len("ipc://"):])
            vol = _mount_volume(px, volumes, sock_dir)
            if not vol or "emptyDir" not in vol:
                say(f"the socket directory {sock_dir} is not an emptyDir mounted in idemproxy")
            else:
                for c in spec.get("containers") or []:
                    env = {e.get("name"): e.get("value") for e in c.get("env") or []}
                    app_ep = env.get("IDEMPROXY_ENDPOINT", endpoint)
                    if app_ep != endpoint:
                        say(f"container {c['name']}: IDEMPROXY_ENDPOINT {app_ep} is not {endpoint}")
                    if _mount_volume(c, volumes, sock_dir) is not vol:
                        say(f"container {c['name']} does not mount the socket emptyDir at {sock_dir}")
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in volumes:
                    say(f"container {c.get('name')} mounts volume {m.get('name')!r}, which the pod does not have")
        if not (spec.get("securityContext") or {}).get("fsGroup"):
            say("no pod fsGroup: the app container may not reach the 0660 socket")
        # disruption budget
        labels = pod.get("metadata", {}).get("labels") or {}
        pdbs = [o for o in objs if o.get("kind") == "PodDisruptionBudget"
                and o["spec"].get("selector", {}).get("matchLabels")
                and all(labels.get(k) == v for k, v in o["spec"]["selector"]["matchLabels"].items())]
        if not pdbs:
            say("no PodDisruptionBudget selects its pods")
    for p in problems:
        print(p)
    if not problems:
        print(f"{path}: consistent ({len(deployments)} Deployment)")
    return 1 if problems else 0


def _sidecar_view(path):
    deployments = [o for o in load(path) if o.get("kind") == "Deployment"]
    if len(deployments) != 1:
        return None, f"{path}: {len(deployments)} Deployments (want 1)"
    pod = deployments[0]["spec"]["template"]
    spec = pod["spec"]
    px = next((c for c in spec.get("initContainers") or [] if c.get("name") == "idemproxy"), None)
    if px is None:
        return None, f"{path}: no initContainer named idemproxy"
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounted = {}
    for m in px.get("volumeMounts") or []:
        v = dict(volumes.get(m["name"]) or {"missing": True})
        if "configMap" in v:
            cm = dict(v["configMap"])
            cm["name"] = re.sub(r"-[a-z0-9]{10}$", "", cm["name"])  # kustomize's content hash
            v["configMap"] = cm
        mounted[m["name"]] = v
    apps = {}
    for c in spec.get("containers") or []:
        env = {e.get("name"): e.get("value") for e in c.get("env") or []}
        sock = [m for m in c.get("volumeMounts") or [] if m.get("name") == "socket"]
        apps[c["name"]] = {"IDEMPROXY_ENDPOINT": env.get("IDEMPROXY_ENDPOINT"), "socket": sock}
    ann = {k: v for k, v in ((pod.get("metadata") or {}).get("annotations") or {}).items()
           if k.startswith("prometheus.io/")}
    return {"initContainer": px, "volumes": mounted, "app containers": sorted(apps.values(), key=str),
            "fsGroup": (spec.get("securityContext") or {}).get("fsGroup"), "annotations": ann}, None


def sidecar(a, b):
    va, err = _sidecar_view(a)
    vb, err2 = _sidecar_view(b)
    if err or err2:
        print(err or err2)
        return 1
    if va == vb:
        print(f"the same sidecar in {a} and {b}")
        return 0
    print(f"the sidecar differs between {a} and {b}:")
    for line in difflib.unified_diff(dump(va), dump(vb), a, b, lineterm="", n=2):
        print("    " + line)
    return 1


def config(path, out, name=None):
    found = []
    for o in load(path):
        if o.get("kind") == "ConfigMap" and "idemproxy.yaml" in (o.get("data") or {}):
            if name is None or o["metadata"]["name"] == name:
                found.append(o)
    if len(found) != 1:
        print(f"{path}: {len(found)} ConfigMaps with an idemproxy.yaml key (want 1)", file=sys.stderr)
        return 1
    with open(out, "w", encoding="utf-8") as f:
        f.write(found[0]["data"]["idemproxy.yaml"])
    return 0


def main(argv):
    if len(argv) == 3 and argv[0] == "compare":
        return compare(argv[1], argv[2])
    if len(argv) == 3 and argv[0] == "sidecar":
        return sidecar(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "consistency":
        return consistency(argv[1])
    if len(argv) in (3, 4) and argv[0] == "config":
        return config(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
