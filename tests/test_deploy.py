"""deploy/: the tree a Flux Kustomization points at. Built with kustomize semantics (``kubectl
kustomize``), every built-in kind validated offline against a current Kubernetes schema with
strict validation (unknown fields are errors), CRD kinds checked structurally, and what the
router relies on asserted. tests/kube/test_deploy_apply.py applies the core objects to the real
test API server."""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from router.config import parse_config
from tests.deploy_tree import CRD_KINDS, DEPLOY, Obj, build, find, role_rules, selects

TREES = ["base", "overlays/single-node", "overlays/shared-gpu", "flux"]
SCHEMA = kubernetes_validate.utils.latest_version()
"""The newest Kubernetes schema kubernetes-validate ships (1.37 as written)."""


def validate(obj: Obj) -> None:
    kubernetes_validate.validate(obj, SCHEMA, strict=True)


@pytest.mark.parametrize("tree", TREES)
def test_every_object_is_valid_for_current_kubernetes_or_a_known_crd(tree: str) -> None:
    objects = build(tree)
    assert objects
    for obj in objects:
        where = f"{tree}: {obj['kind']} {obj['metadata'].get('name')}"
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            assert not crd_problems(obj), f"{where}: {crd_problems(obj)}"
            continue
        try:
            validate(obj)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise AssertionError(f"{where}: {path}: {exc.message}") from None
        except kubernetes_validate.SchemaNotFoundError:
            raise AssertionError(f"{where}: neither a built-in kind nor a known CRD") from None


def test_the_validator_is_strict() -> None:
    """It rejects unknown fields: e.g. the flat v1beta1 device request inside a v1 template."""
    template = copy.deepcopy(find(build("base"), "ResourceClaimTemplate", "tensor-parallel-4"))
    request = template["spec"]["spec"]["devices"]["requests"][0]
    request.update(request.pop("exactly"))
    with pytest.raises(kubernetes_validate.ValidationError, match="deviceClassName"):
        validate(template)
    deployment = copy.deepcopy(find(build("base"), "Deployment", "comfyui"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["failure"] = 1
    with pytest.raises(kubernetes_validate.ValidationError, match="failure"):
        validate(deployment)


# -- the router -------------------------------------------------------------------------------


def test_the_router_runs_twice_with_probes_on_the_admin_port() -> None:
    objects = build("base")
    router = find(objects, "Deployment", "warmgate")
    assert router["spec"]["replicas"] == 2
    pod = router["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "warmgate"
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "admin": 9090}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    service = find(objects, "Service", "warmgate")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    # Each replica knows its own name (the EndpointSlices' targetRef) and address.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
    }


def replicas_config(objects: list[Obj]) -> Any:
    configmap = find(objects, "ConfigMap")
    data = yaml.safe_load(configmap["data"]["warmgate.yaml"])
    assert data.get("replicas") is not None, "the replicas: block"
    router = find(objects, "Deployment", "warmgate")
    with tempfile.TemporaryDirectory() as tmp:
        data["replicas"]["token_file"] = replicas_token_file(router, data, Path(tmp))
        return parse_config(data, "warmgate.yaml")


@pytest.mark.parametrize("tree", ["base", "overlays/single-node"])
def test_the_replicas_find_each_other_through_a_headless_service(tree: str) -> None:
    """replicas: in the config names a headless Service over warmgate's own pods whose port
    reaches admin_listen, listing replicas that are not ready too (starting or draining)."""
    objects = build(tree)
    config = replicas_config(objects)
    spec = config.replicas
    router = find(objects, "Deployment", "warmgate")
    service = find(objects, "Service", spec.service)
    assert service["metadata"]["namespace"] == spec.namespace == router["metadata"]["namespace"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    pod_labels = router["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    (port,) = service["spec"]["ports"]
    assert spec.port in (port["name"], port["port"])
    (container,) = router["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == config.admin_listen.port
    # The Lease the config names is the one the Role lets warmgate update.
    leader = find(objects, "Role", "warmgate-leader")
    assert leader["metadata"]["namespace"] == spec.namespace
    assert ("coordination.k8s.io", "leases", (spec.lease,)) in role_rules(leader)
    assert spec.identity is None, "default: $POD_NAME from the Downward API"


def test_a_voluntary_disruption_takes_one_replica_at_a_time() -> None:
    objects = build("base")
    router = find(objects, "Deployment", "warmgate")
    pdb = find(objects, "PodDisruptionBudget", "warmgate")
    assert pdb["metadata"]["namespace"] == router["metadata"]["namespace"]
    assert pdb["spec"] == {"minAvailable": 1, "selector": router["spec"]["selector"]}
    assert selects(pdb["spec"]["selector"], router["spec"]["template"]["metadata"]["labels"])
    assert router["spec"]["replicas"] > pdb["spec"]["minAvailable"], "a drain can proceed"


def test_the_admin_port_is_open_to_the_replicas_and_prometheus_only() -> None:
    """fence is not authenticated: the NetworkPolicy lets only warmgate's pods and Prometheus
    reach the admin port; every other port the pod serves keeps a rule (nothing is cut off)."""
    objects = build("base")
    router = find(objects, "Deployment", "warmgate")
    labels = router["spec"]["template"]["metadata"]["labels"]
    policy = find(objects, "NetworkPolicy", "warmgate")
    assert policy["metadata"]["namespace"] == router["metadata"]["namespace"]
    assert selects(policy["spec"]["podSelector"], labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress stays open"
    sources = open_ports(policy)
    (container,) = router["spec"]["template"]["spec"]["containers"]
    assert set(sources) == {p["name"] for p in container["ports"]}, "a rule for every port"
    assert sources["http"] is None, "the Gateway reaches http from anywhere"
    admin = sources["admin"]
    assert admin is not None
    peers = [p for p in admin if "namespaceSelector" not in p]
    assert peers and all(selects(p["podSelector"], labels) for p in peers), "the replicas"
    (prometheus,) = [p for p in admin if "namespaceSelector" in p]
    assert prometheus["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert "ipBlock" not in str(admin)


def open_ports(policy: Obj) -> dict[str, list[Obj] | None]:
    """Port name -> the peers an ingress rule admits (None: every source)."""
    out: dict[str, list[Obj] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP" and isinstance(port["port"], str), port
            peers = rule.get("from")
            before = out.get(port["port"], [])
            out[port["port"]] = None if peers is None or before is None else [*before, *peers]
    return out


@pytest.mark.parametrize("tree", ["base", "overlays/single-node", "overlays/shared-gpu"])
def test_the_configmap_holds_a_valid_config_for_the_render_deployments(
    tree: str, tmp_path: Path
) -> None:
    objects = build(tree)
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert re.fullmatch(r"warmgate-config-[a-z0-9]{10}", configmap["metadata"]["name"])
    router = find(objects, "Deployment", "warmgate")
    volumes = router["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["configMap"]["name"] == configmap["metadata"]["name"]
    data = yaml.safe_load(configmap["data"]["warmgate.yaml"])
    data["replicas"]["token_file"] = replicas_token_file(router, data, tmp_path)
    config = parse_config(data, "warmgate.yaml")
    assert config.admin_listen.port == 9090 and config.listen.port == 8080
    for name, target in config.targets.items():
        backend = target.backend
        assert backend.kind == "kubernetes" and backend.mode == "direct", name
        deployment = find(objects, "Deployment", backend.deployment)
        assert deployment["metadata"]["namespace"] == backend.namespace
        service = find(objects, "Service", backend.service_name)
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "http", "containerPort": backend.port} in container["ports"]


def replicas_token_file(router: Obj, config: Obj, tmp_path: Path) -> str:
    """The config's ``replicas.token_file`` is the Secret warmgate-replicas, mounted read-only
    into the router's pods and readable by warmgate's user; returns a stand-in file."""
    pod = router["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    token_file = config["replicas"]["token_file"]
    (mount,) = [m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "warmgate-replicas"
    assert secret["items"] == [{"key": "token", "path": token_file.rpartition("/")[2]}]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    assert secret["defaultMode"] & 0o040, "the group (fsGroup: warmgate) reads it"
    stand_in = tmp_path / "replicas-token"
    stand_in.write_text("a-token-from-the-secret\n")
    return str(stand_in)


def test_the_role_is_least_privilege() -> None:
    objects = build("base")
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Role"} == {
        "warmgate-scaler",
        "warmgate-leader",
    }
    scaler = find(objects, "Role", "warmgate-scaler")
    assert scaler["metadata"]["namespace"] == "render"
    render = sorted(
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["namespace"] == "render"
    )
    assert role_rules(scaler) == {
        ("apps", "deployments", ()): ["get", "list", "watch"],
        # the learned cold-start annotation, on the render Deployments by name only
        ("apps", "deployments", tuple(render)): ["patch"],
        ("apps", "deployments/scale", ()): ["get", "patch"],
        ("discovery.k8s.io", "endpointslices", ()): ["get", "list", "watch"],
        ("", "pods", ()): ["get", "list", "watch"],  # the stage of a start; never changed
        ("autoscaling", "horizontalpodautoscalers", ()): ["list"],
        ("keda.sh", "scaledobjects", ()): ["list"],
    }
    # Several replicas: the peers' EndpointSlices, and the one leader Lease (create cannot be
    # limited to a name; get and update are).
    leader = find(objects, "Role", "warmgate-leader")
    assert leader["metadata"]["namespace"] == "warmgate"
    assert role_rules(leader) == {
        ("discovery.k8s.io", "endpointslices", ()): ["get", "list", "watch"],
        ("coordination.k8s.io", "leases", ()): ["create"],
        ("coordination.k8s.io", "leases", ("warmgate-leader",)): ["get", "update"],
        # the day's cloud spend, written through so a restart does not start it at zero
        ("", "configmaps", ()): ["create"],
        ("", "configmaps", ("warmgate-state",)): ["get", "patch"],
    }
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "warmgate", "namespace": "warmgate"}
        ]
    text = yaml.safe_dump_all(objects)
    assert "'*'" not in text and '"*"' not in text.replace('"*.render', "")


# -- the render engines -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["comfyui", "wan2gp"])
def test_render_deployments_run_as_a_lab_runs_them(name: str) -> None:
    objects = build("base")
    deployment = find(objects, "Deployment", name)
    spec = deployment["spec"]
    assert spec["replicas"] == 0, "no GPU held until warmgate scales it up"
    assert spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EAGER_LOAD_MODEL"] == "1"
    probe = container["readinessProbe"]
    assert probe["httpGet"]["path"] == "/readyz" and probe["failureThreshold"] == 40
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["models"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes["models"]["persistentVolumeClaim"]
    assert claim == {"claimName": "models", "readOnly": True}
    pvc = find(objects, "PersistentVolumeClaim", "models")
    pv = find(objects, "PersistentVolume", pvc["spec"]["volumeName"])
    assert pvc["spec"]["accessModes"] == pv["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pv["spec"]["nfs"]["readOnly"] is True and "ro" in pv["spec"]["mountOptions"]
    # The GPU comes through a DRA ResourceClaim, not the nvidia.com/gpu extended resource.
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert container["resources"]["claims"] == [{"name": "gpu"}]
    (pod_claim,) = pod["resourceClaims"]
    assert pod_claim == {"name": "gpu", "resourceClaimTemplateName": "single-gpu"}
    template = find(objects, "ResourceClaimTemplate", "single-gpu")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert request["exactly"]["count"] == 1


def test_render_uis_preempt_batch_work_for_a_gpu() -> None:
    objects = build("base")
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PriorityClass"}
    assert set(classes) == {"warmgate-interactive", "batch"}
    interactive, batch = classes["warmgate-interactive"], classes["batch"]
    assert interactive["value"] > batch["value"] > 0, "interactive preempts batch; batch > none"
    assert interactive["preemptionPolicy"] == "PreemptLowerPriority"
    assert batch["preemptionPolicy"] == "Never", "batch waits its turn, it evicts nothing"
    assert not interactive.get("globalDefault") and not batch.get("globalDefault")
    assert "namespace" not in interactive["metadata"]  # cluster-scoped
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        if deployment["metadata"]["namespace"] == "render":
            assert pod["priorityClassName"] == "warmgate-interactive"
        else:  # the router itself competes for no GPU
            assert "priorityClassName" not in pod


def test_tensor_parallel_asks_for_a_coherent_set_of_four() -> None:
    template = find(build("base"), "ResourceClaimTemplate", "tensor-parallel-4")
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == "gpu.nvidia.com"
    assert (exactly["allocationMode"], exactly["count"]) == ("ExactCount", 4)
    (selector,) = exactly["selectors"]
    expression = selector["cel"]["expression"]
    assert "device.attributes['gpu.nvidia.com'].productName" in expression
    # Attributes NVIDIA's driver publishes; a link width is not one of them.
    published = {"productName", "type", "architecture", "brand", "uuid", "cudaComputeCapability"}
    used = set(re.findall(r"device\.attributes\['gpu\.nvidia\.com'\]\.(\w+)", expression))
    assert used <= published, used - published
    assert "linkWidth" not in yaml.safe_dump(template) and "pci.nvidia.com" not in expression
    constraints = {c["matchAttribute"]: c["requests"] for c in devices["constraints"]}
    assert constraints["resource.kubernetes.io/pcieRoot"] == ["gpus"]
    source = (DEPLOY / "base/render/gpu-claims.yaml").read_text()
    assert "coherent set of 4 GPUs" in source and "PCIe root" in source  # the why, in a comment


# -- the gateway, Flux and the overlay --------------------------------------------------------


def test_the_httproute_sends_the_render_hosts_to_warmgate() -> None:
    objects = build("base")
    route = find(objects, "HTTPRoute", "render")
    gateway = find(objects, "Gateway", "render")
    assert gateway["spec"]["gatewayClassName"] == "cilium"
    assert route["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "warmgate", "port": 80}]
    config = yaml.safe_load(find(objects, "ConfigMap")["data"]["warmgate.yaml"])
    hosts = {h for t in config["targets"].values() for r in t["routes"] for h in r["hosts"]}
    assert set(route["spec"]["hostnames"]) == hosts
    suffix = gateway["spec"]["listeners"][0]["hostname"].removeprefix("*")
    assert all(h.endswith(suffix) for h in hosts)


def test_flux_builds_the_single_node_overlay_from_this_repository() -> None:
    objects = build("flux")
    source = find(objects, "GitRepository", "warmgate")
    kustomization = find(objects, "Kustomization", "warmgate")
    ref = kustomization["spec"]["sourceRef"]
    assert (ref["kind"], ref["name"]) == ("GitRepository", source["metadata"]["name"])
    path = kustomization["spec"]["path"]
    assert path == "./deploy/overlays/single-node" and (DEPLOY.parent / path).is_dir()
    assert kustomization["spec"]["prune"] is True
    assert build(path.removeprefix("./deploy/"))


def test_the_single_node_overlay() -> None:
    objects = build("overlays/single-node")
    router = find(objects, "Deployment", "warmgate")
    assert router["spec"]["replicas"] == 1
    assert "topologySpreadConstraints" not in router["spec"]["template"]["spec"]
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget"], "a drain could hang"
    assert find(objects, "NetworkPolicy", "warmgate")
    pv = find(objects, "PersistentVolume", "render-models")
    assert "nfs" not in pv["spec"] and pv["spec"]["hostPath"]["path"] == "/srv/models"
    route = find(objects, "HTTPRoute", "render")
    config = yaml.safe_load(find(objects, "ConfigMap")["data"]["warmgate.yaml"])
    hosts = {h for t in config["targets"].values() for r in t["routes"] for h in r["hosts"]}
    assert set(route["spec"]["hostnames"]) == hosts == {"comfyui.lab.local", "wan2gp.lab.local"}
    for name in ("comfyui", "wan2gp"):
        assert find(objects, "Deployment", name)["spec"]["replicas"] == 0


def test_the_shared_gpu_overlay_shares_one_claim_and_pools_it() -> None:
    """ComfyUI and Wan2GP hold one ResourceClaim (not a claim each from a template), and
    warmgate's pool of capacity 1 decides which has the card: ComfyUI parks, Wan2GP stops."""
    objects = build("overlays/shared-gpu")
    claim = find(objects, "ResourceClaim", "render-gpu")
    assert claim["metadata"]["namespace"] == "render"
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert request["exactly"]["count"] == 1
    for name in ("comfyui", "wan2gp"):
        pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "render-gpu"}]
        assert pod["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
    router = find(objects, "Deployment", "warmgate")
    assert router["spec"]["replicas"] == 1, "one replica counts the pool (docs/pools.md)"
    data = yaml.safe_load(find(objects, "ConfigMap")["data"]["warmgate.yaml"])
    with tempfile.TemporaryDirectory() as tmp:
        data["replicas"]["token_file"] = replicas_token_file(router, data, Path(tmp))
        config = parse_config(data, "warmgate.yaml")
    assert config.pools["gpu"].capacity == 1
    targets = config.targets
    assert {n for n, t in targets.items() if t.pool == "gpu"} == {"comfyui", "wan2gp"}
    assert targets["comfyui"].scaling.park_after and targets["comfyui"].park == "auto"


# -- structural checks of CRD kinds -------------------------------------------------------------

_Shape = dict[str, Any]
_CRD_SHAPES: dict[str, _Shape] = {
    # required keys -> their type; "optional" lists the other keys allowed (from the CRDs)
    "Gateway": {
        "required": {"gatewayClassName": str, "listeners": list},
        "optional": {"addresses", "infrastructure", "backendTLS", "allowedListeners"},
        "listener": {"name", "protocol", "port", "hostname", "allowedRoutes", "tls"},
    },
    "HTTPRoute": {
        "required": {"parentRefs": list, "rules": list},
        "optional": {"hostnames"},
        "rule": {
            "name", "matches", "filters", "backendRefs", "timeouts", "retry",
            "sessionPersistence",
        },
    },
    "GitRepository": {
        "required": {"url": str, "interval": str},
        "optional": {
            "ref", "secretRef", "timeout", "ignore", "suspend", "include", "verify",
            "recurseSubmodules", "proxySecretRef", "provider", "sparseCheckout",
        },
    },
    "Kustomization": {
        "required": {"interval": str, "sourceRef": dict, "prune": bool},
        "optional": {
            "path", "timeout", "retryInterval", "wait", "healthChecks", "dependsOn",
            "targetNamespace", "patches", "images", "postBuild", "suspend", "force",
            "serviceAccountName", "decryption", "commonMetadata", "components", "namePrefix",
            "nameSuffix", "kubeConfig", "deletionPolicy", "healthCheckExprs",
        },
    },
}  # fmt: skip
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$")


def crd_problems(obj: Obj) -> list[str]:
    kind, spec = obj["kind"], obj.get("spec")
    shape = _CRD_SHAPES[kind]
    meta = obj.get("metadata") or {}
    problems = [] if meta.get("name") and meta.get("namespace") else ["needs name and namespace"]
    if not isinstance(spec, dict):
        return [*problems, "spec must be a mapping"]
    for key, kind_of in shape["required"].items():
        if not isinstance(spec.get(key), kind_of):
            problems.append(f"spec.{key} must be a {kind_of.__name__}")
    unknown = set(spec) - set(shape["required"]) - shape["optional"]
    problems += [f"spec.{key} is not a field of {kind}" for key in sorted(unknown)]
    for key in ("interval", "timeout", "retryInterval"):
        if key in spec and not _DURATION.match(str(spec[key])):
            problems.append(f"spec.{key}: expected a Go duration such as 5m, got {spec[key]!r}")
    if kind == "Gateway":
        for listener in spec.get("listeners") or ():
            extra = set(listener) - shape["listener"]
            problems += [f"listener field {k} unknown" for k in sorted(extra)]
            if listener.get("protocol") not in ("HTTP", "HTTPS", "TLS", "TCP", "UDP"):
                problems.append(f"listener protocol {listener.get('protocol')!r}")
    if kind == "HTTPRoute":
        for rule in spec.get("rules") or ():
            extra = set(rule) - shape["rule"]
            problems += [f"rule field {k} unknown" for k in sorted(extra)]
            for ref in rule.get("backendRefs") or ():
                if not (isinstance(ref.get("name"), str) and isinstance(ref.get("port"), int)):
                    problems.append("a backendRef needs name and port")
            timeouts = rule.get("timeouts") or {}
            if set(timeouts) - {"request", "backendRequest"} or not all(
                _DURATION.match(str(v)) for v in timeouts.values()
            ):
                problems.append(f"timeouts {timeouts!r}")
    if kind == "Kustomization":
        ref = spec["sourceRef"] if isinstance(spec.get("sourceRef"), dict) else {}
        if ref.get("kind") not in ("GitRepository", "OCIRepository", "Bucket") or not ref.get(
            "name"
        ):
            problems.append(f"sourceRef {ref!r}")
    return problems


def test_crd_checks_catch_mistakes() -> None:
    route = find(build("base"), "HTTPRoute", "render")
    assert crd_problems(route) == []
    broken = copy.deepcopy(route)
    broken["spec"]["rules"][0]["backendRef"] = broken["spec"]["rules"][0].pop("backendRefs")
    broken["spec"]["hostname"] = broken["spec"].pop("hostnames")
    assert crd_problems(broken) == [
        "spec.hostname is not a field of HTTPRoute",
        "rule field backendRef unknown",
    ]
