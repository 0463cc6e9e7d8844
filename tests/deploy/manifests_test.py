#!/usr/bin/env python3
"""Static checks of deploy/: the Kubernetes manifests (each kustomize directory under deploy/k8s,
rendered with `kubectl kustomize`), the compose files and Prometheus config, the example server
config, and the paths that the docs cite. No containers, no cluster: what can be wrong in the
files themselves — a shard node without --node_id, a router with a volume, a probe on the wrong
port, a flag the server does not know, a grace period shorter than the drain.

  python3 tests/deploy/manifests_test.py [-v]

Needs PyYAML (Debian: python3-yaml); skips everything, saying so, without it. Without kubectl the
manifests are assembled by this test from each kustomization.yaml (resources, namespace,
configMapGenerator, images: the fields these directories use) and the render-with-kubectl test
is skipped.
"""
import re
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    yaml = None

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_CLUSTER = DEPLOY / "compose" / "compose.yaml"
COMPOSE_SINGLE = DEPLOY / "compose.yaml"
SERVER_CONFIG = DEPLOY / "config" / "tessera.yaml"
KUBECTL = shutil.which("kubectl")

GRPC_PORT = 50051
METRICS_PORT = 9464
DEFAULT_SHUTDOWN_GRACE = 10.0  # the server's default shutdown_grace_seconds
BOOLEAN_FLAGS = {"insecure", "sync_writes"}  # may stand without a value
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition"}


def skip_without_yaml(cls):
    if yaml is None:
        print("manifests_test: PyYAML is not installed (apt-get install python3-yaml); skipping",
              file=sys.stderr)
        return unittest.skip("PyYAML not installed")(cls)
    return cls


# -- helpers -----------------------------------------------------------------------------------

def server_setting_names():
    """Every flag/config key tessera-server accepts, read from server/config.cc (empty when that
    file's layout changed, and then the checks that use it are skipped)."""
    source = ROOT / "server" / "config.cc"
    if not source.exists():
        return set()
    text = source.read_text()
    names = set(re.findall(r'settings\["(\w+)"\]\s*=', text))
    names |= set(re.findall(r'\b(?:text|address|integer|boolean|seconds)\("(\w+)"', text))
    return names


def parse_flags(args):
    """tessera-server's command line as the server reads it: "--name value", "--name=value", and
    a boolean flag alone before another flag or at the end. Returns (name, value) pairs in order;
    the last occurrence of a name wins."""
    pairs, i = [], 0
    while i < len(args):
        arg = str(args[i])
        if not arg.startswith("--"):
            raise AssertionError(f"unexpected argument {arg!r} in {args}")
        if "=" in arg:
            name, value = arg[2:].split("=", 1)
        elif arg[2:] in BOOLEAN_FLAGS and (i + 1 == len(args) or str(args[i + 1]).startswith("--")):
            name, value = arg[2:], "true"
        else:
            if i + 1 == len(args):
                raise AssertionError(f"{arg} needs a value in {args}")
            name, value = arg[2:], str(args[i + 1])
            i += 1
        pairs.append((name, value))
        i += 1
    return pairs


def flags_of(args):
    return dict(parse_flags(args))


def etcd_flags(args):
    """etcd's flags as "--name=value" (or "--name value") into a dict."""
    out, i = {}, 0
    while i < len(args):
        arg = str(args[i])
        if arg.startswith("--") and "=" in arg:
            name, value = arg[2:].split("=", 1)
            out[name] = value
        elif arg.startswith("--") and i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
            out[arg[2:]] = str(args[i + 1])
            i += 1
        i += 1
    return out


def quantity(value, memory):
    """A Kubernetes quantity as a number (CPU in cores, memory in bytes)."""
    text = str(value)
    if not memory:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def is_tessera_image(image):
    repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return repository.rsplit("/", 1)[-1] == "tessera"


def kustomize_image(directory):
    """The tessera image reference the kustomization sets ("localhost/tessera:latest")."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for image in kustomization.get("images", []):
        if image["name"].rsplit("/", 1)[-1] == "tessera":
            return f'{image.get("newName", image["name"])}:{image.get("newTag", "latest")}'
    return None


def assemble_without_kubectl(directory):
    """What `kubectl kustomize` would render for the fields these kustomizations use."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs = []
    for resource in kustomization.get("resources", []):
        docs += [d for d in yaml.safe_load_all((directory / resource).read_text()) if d]
    for generator in kustomization.get("configMapGenerator", []):
        data = {}
        for entry in generator.get("files", []):
            key, _, path = entry.partition("=") if "=" in entry else (Path(entry).name, "", entry)
            data[key] = (directory / path).read_text()
        metadata = {"name": generator["name"]}
        labels = generator.get("options", {}).get("labels")
        if labels:
            metadata["labels"] = labels
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    namespace = kustomization.get("namespace")
    images = {i["name"]: i for i in kustomization.get("images", [])}
    for doc in docs:
        if namespace and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
        for spec in [pod_spec(doc)] if pod_spec(doc) else []:
            for container in spec.get("containers", []) + spec.get("initContainers", []):
                name, _, tag = container["image"].rpartition(":")
                if name in images:
                    override = images[name]
                    container["image"] = (f'{override.get("newName", name)}:'
                                          f'{override.get("newTag", tag)}')
    return docs


def pod_spec(doc):
    if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def pod_labels(doc):
    return doc["spec"]["template"]["metadata"].get("labels", {})


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def probe_ok(probe, container):
    """A grpc probe on the gRPC port, or an HTTP GET of /healthz on the metrics port."""
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if "grpc" in probe:
        return probe["grpc"]["port"] == GRPC_PORT
    if "httpGet" in probe:
        port = probe["httpGet"]["port"]
        port = ports.get(port, port)
        return probe["httpGet"]["path"] == "/healthz" and port == METRICS_PORT
    return False


# -- Kubernetes --------------------------------------------------------------------------------

@skip_without_yaml
class KubernetesManifests(unittest.TestCase):
    """Every kustomize directory under deploy/k8s, rendered."""

    @classmethod
    def setUpClass(cls):
        cls.dirs = sorted(p.parent for p in K8S.glob("*/kustomization.yaml"))
        cls.rendered = {}
        if not KUBECTL:
            print("manifests_test: kubectl not found: assembling each kustomization without it "
                  "(the render-with-kubectl test is skipped)", file=sys.stderr)
        for directory in cls.dirs:
            if KUBECTL:
                result = subprocess.run([KUBECTL, "kustomize", str(directory)],
                                        capture_output=True, text=True, timeout=60)
                if result.returncode != 0:
                    raise AssertionError(f"kubectl kustomize {directory}: {result.stderr}")
                docs = [d for d in yaml.safe_load_all(result.stdout) if d]
            else:
                docs = assemble_without_kubectl(directory)
            cls.rendered[directory.name] = docs
        cls.settings = server_setting_names()

    def workloads(self, name):
        return [d for d in self.rendered[name] if pod_spec(d)]

    def containers(self, name):
        for doc in self.workloads(name):
            for container in pod_spec(doc)["containers"]:
                yield doc, container

    def config_for(self, name, doc):
        """The server YAML (a dict) that the pod mounts, and the --config path."""
        spec = pod_spec(doc)
        maps = {d["metadata"]["name"]: d for d in self.rendered[name] if d["kind"] == "ConfigMap"}
        for container in spec["containers"]:
            if not is_tessera_image(container["image"]):
                continue
            flags = flags_of(container.get("args", []))
            if "config" not in flags:
                return {}
            for mount in container.get("volumeMounts", []):
                prefix = mount["mountPath"].rstrip("/") + "/"
                if not flags["config"].startswith(prefix):
                    continue
                volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
                self.assertIn("configMap", volume, f"{flags['config']} is not from a ConfigMap")
                config_map = maps.get(volume["configMap"]["name"])
                self.assertIsNotNone(config_map, f"ConfigMap {volume['configMap']['name']} is "
                                                 f"not in the rendered {name} manifests")
                key = flags["config"][len(prefix):]
                self.assertIn(key, config_map["data"])
                return yaml.safe_load(config_map["data"][key]) or {}
            self.fail(f"{doc['metadata']['name']}: --config {flags['config']} is not mounted")
        return {}

    def test_directories(self):
        self.assertEqual({d.name for d in self.dirs}, {"standalone", "cluster"})

    @unittest.skipUnless(KUBECTL, "kubectl not installed")
    def test_kubectl_renders(self):  # setUpClass did it; this records that it ran
        for name, docs in self.rendered.items():
            self.assertTrue(docs, f"{name}: nothing rendered")

    def test_namespace(self):
        for name, docs in self.rendered.items():
            namespaces = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
            self.assertEqual(len(namespaces), 1, name)
            namespace = next(d for d in docs if d["kind"] == "Namespace")
            self.assertEqual(namespace["metadata"]["labels"]
                             .get("pod-security.kubernetes.io/enforce"), "restricted")
            for doc in docs:
                if doc["kind"] not in CLUSTER_SCOPED:
                    self.assertEqual(doc["metadata"].get("namespace"), namespaces[0],
                                     f"{name}: {doc['kind']}/{doc['metadata']['name']}")

    def test_images(self):
        expected = {kustomize_image(d) for d in self.dirs}
        self.assertEqual(len(expected), 1, f"the kustomizations name different images: {expected}")
        expected = expected.pop()
        for name in self.rendered:
            tessera = 0
            for doc, container in self.containers(name):
                if is_tessera_image(container["image"]):
                    tessera += 1
                    self.assertEqual(container["image"], expected, doc["metadata"]["name"])
                else:  # etcd and any other third-party image: a pinned version
                    self.assertRegex(container["image"], r":v?\d+\.\d+\.\d+$",
                                     f"{doc['metadata']['name']}: pin {container['image']}")
            self.assertGreater(tessera, 0, name)

    def test_restricted_pod_security(self):
        for name in self.rendered:
            for doc in self.workloads(name):
                spec, what = pod_spec(doc), f"{name}: {doc['metadata']['name']}"
                context = spec.get("securityContext", {})
                self.assertTrue(context.get("runAsNonRoot"), what)
                self.assertEqual(context.get("seccompProfile", {}).get("type"), "RuntimeDefault",
                                 what)
                if any(is_tessera_image(c["image"]) for c in spec["containers"]):
                    self.assertEqual(context.get("runAsUser"), 10001, what)
                    self.assertEqual(context.get("fsGroup"), 10001, what)
                for container in spec["containers"]:
                    security = container.get("securityContext", {})
                    self.assertIs(security.get("allowPrivilegeEscalation"), False, what)
                    self.assertEqual(security.get("capabilities", {}).get("drop"), ["ALL"], what)

    def test_resources(self):
        for name in self.rendered:
            for doc, container in self.containers(name):
                what = f"{name}: {doc['metadata']['name']}"
                resources = container.get("resources", {})
                for kind in ("cpu", "memory"):
                    request = resources.get("requests", {}).get(kind)
                    limit = resources.get("limits", {}).get(kind)
                    self.assertIsNotNone(request, f"{what}: no {kind} request")
                    self.assertIsNotNone(limit, f"{what}: no {kind} limit")
                    self.assertLessEqual(quantity(request, kind == "memory"),
                                         quantity(limit, kind == "memory"), what)

    def test_probes(self):
        for name in self.rendered:
            for doc, container in self.containers(name):
                what = f"{name}: {doc['metadata']['name']}"
                for probe in ("readinessProbe", "livenessProbe"):
                    self.assertIn(probe, container, f"{what}: no {probe}")
                if not is_tessera_image(container["image"]):
                    continue
                # Flags win over the config file.
                settings = {**self.config_for(name, doc),
                            **flags_of(container.get("args", []))}
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe not in container:
                        continue
                    self.assertTrue(probe_ok(container[probe], container),
                                    f"{what}: {probe} is neither grpc on {GRPC_PORT} nor GET "
                                    f"/healthz on {METRICS_PORT}: {container[probe]}")
                    # The kubelet's grpc probe is plaintext and sends no API key.
                    if "grpc" in container[probe]:
                        self.assertFalse(settings.get("tls_cert") or settings.get("api_keys"),
                                         f"{what}: grpc {probe} with TLS or API keys on")

    def test_flags_and_config_keys_are_known(self):
        if not self.settings:
            self.skipTest("no setting names found in server/config.cc")
        known = self.settings | {"config"}
        for name in self.rendered:
            for doc, container in self.containers(name):
                if not is_tessera_image(container["image"]):
                    continue
                what = f"{name}: {doc['metadata']['name']}"
                args = container.get("args", [])
                for flag, _ in parse_flags(args):
                    self.assertIn(flag, known, f"{what}: tessera-server has no --{flag}")
                for variable in re.findall(r"\$\((\w+)\)", " ".join(map(str, args))):
                    self.assertIn(variable, env_of(container), f"{what}: $({variable}) undefined")
                for key in self.config_for(name, doc):
                    self.assertIn(key, self.settings, f"{what}: config key {key!r} is unknown")

    def test_grace_period_covers_the_drain(self):
        for name in self.rendered:
            for doc, container in self.containers(name):
                if not is_tessera_image(container["image"]):
                    continue
                config = self.config_for(name, doc)
                grace = float(flags_of(container.get("args", [])).get(
                    "shutdown_grace_seconds", config.get("shutdown_grace_seconds",
                                                         DEFAULT_SHUTDOWN_GRACE)))
                pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {})
                sleep = pre_stop.get("command", [])
                pre_stop_seconds = float(sleep[1]) if sleep[:1] == ["sleep"] else 0.0
                period = pod_spec(doc).get("terminationGracePeriodSeconds", 30)
                self.assertGreater(period, grace + pre_stop_seconds,
                                   f"{name}: {doc['metadata']['name']}")

    def test_services_and_budgets_select_pods(self):
        for name, docs in self.rendered.items():
            workloads = self.workloads(name)
            for doc in docs:
                what = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
                if doc["kind"] == "Service":
                    selector = doc["spec"].get("selector")
                    targets = [w for w in workloads if selects(selector, pod_labels(w))]
                    self.assertTrue(targets, f"{what} selects no pods")
                    for port in doc["spec"]["ports"]:
                        target = port.get("targetPort", port["port"])
                        for workload in targets:
                            ports = [p for c in pod_spec(workload)["containers"]
                                     for p in c.get("ports", [])]
                            self.assertTrue(any(target in (p.get("name"), p["containerPort"])
                                                for p in ports), f"{what}: port {target}")
                if doc["kind"] == "PodDisruptionBudget":
                    selector = doc["spec"]["selector"]["matchLabels"]
                    self.assertTrue(any(selects(selector, pod_labels(w)) for w in workloads),
                                    f"{what} selects no pods")

    # -- the cluster ---------------------------------------------------------------------------

    def role_workloads(self, role):
        found = []
        for doc, container in self.containers("cluster"):
            if is_tessera_image(container["image"]):
                if flags_of(container.get("args", [])).get("role") == role:
                    found.append((doc, container))
        return found

    def etcd_workload(self):
        found = [(d, c) for d, c in self.containers("cluster") if "etcd" in c["image"]]
        self.assertEqual(len(found), 1, "one etcd StatefulSet")
        return found[0]

    def service(self, name):
        found = [d for d in self.rendered["cluster"]
                 if d["kind"] == "Service" and d["metadata"]["name"] == name]
        self.assertEqual(len(found), 1, f"Service {name}")
        return found[0]

    def budget_for(self, doc):
        return [d for d in self.rendered["cluster"] if d["kind"] == "PodDisruptionBudget"
                and selects(d["spec"]["selector"]["matchLabels"], pod_labels(doc))]

    def secret_for_path(self, doc, container, path):
        """The name of the Secret that file `path` of `container` comes from: a volumeMount
        whose mountPath holds it, of a secret volume that projects that file; else None."""
        volumes = {v["name"]: v for v in pod_spec(doc).get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            prefix = mount["mountPath"].rstrip("/") + "/"
            if not str(path).startswith(prefix):
                continue
            secret = volumes.get(mount["name"], {}).get("secret")
            if secret is None:
                return None
            items = secret.get("items")
            if items is not None and str(path)[len(prefix):] not in {i["path"] for i in items}:
                return None
            return secret["secretName"]
        return None

    def assert_from_secret(self, doc, container, path, what):
        secret = self.secret_for_path(doc, container, path)
        self.assertIsNotNone(secret, f"{what}: {path} is not a file of a mounted Secret")
        mount = next(m for m in container["volumeMounts"]
                     if str(path).startswith(m["mountPath"].rstrip("/") + "/"))
        self.assertTrue(mount.get("readOnly"), f"{what}: mount {mount['mountPath']} not readOnly")
        return secret

    def assert_etcd_address(self, value, what):
        """--etcd names a Service of the etcd pods on etcd's client port."""
        etcd, etcd_container = self.etcd_workload()
        host, _, port = value.rpartition(":")
        service = self.service(host.split(".")[0])
        self.assertTrue(selects(service["spec"]["selector"], pod_labels(etcd)), what)
        client_port = int(etcd_flags(etcd_container["args"])["listen-client-urls"]
                          .rsplit(":", 1)[1])
        self.assertEqual(int(port), client_port, what)
        self.assertIn(client_port, [p["port"] for p in service["spec"]["ports"]], what)

    def test_cluster_shard_nodes(self):
        shards = self.role_workloads("shard")
        self.assertEqual(len(shards), 1, "one shard StatefulSet")
        doc, container = shards[0]
        self.assertEqual(doc["kind"], "StatefulSet")
        self.assertGreaterEqual(doc["spec"]["replicas"], 3)
        flags, env = flags_of(container["args"]), env_of(container)
        self.assert_etcd_address(flags["etcd"], "shard --etcd")
        # Name and address from the pod: node_id = pod name, advertise = its headless DNS name.
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        self.assertEqual(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.namespace")
        self.assertEqual(flags["node_id"], "$(POD_NAME)")
        headless = doc["spec"]["serviceName"]
        self.assertRegex(flags["advertise_address"],
                         rf"^\$\(POD_NAME\)\.{re.escape(headless)}\.\$\(POD_NAMESPACE\)\.svc"
                         rf"(\.[^:]+)?:{GRPC_PORT}$")
        service = self.service(headless)
        self.assertEqual(service["spec"].get("clusterIP"), "None")
        self.assertTrue(service["spec"].get("publishNotReadyAddresses"))
        self.assertTrue(selects(service["spec"]["selector"], pod_labels(doc)))
        # Its data: a claim from volumeClaimTemplates mounted at /data (the entrypoint's data_dir).
        claims = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
        data = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
        self.assertEqual(len(data), 1)
        self.assertIn(data[0]["name"], claims)
        self.assertEqual(flags.get("data_dir", "/data"), "/data")
        self.assertTrue(self.budget_for(doc), "no PodDisruptionBudget for the shard nodes")

    def test_cluster_routers(self):
        routers = self.role_workloads("router")
        self.assertEqual(len(routers), 1, "one router Deployment")
        doc, container = routers[0]
        self.assertEqual(doc["kind"], "Deployment")
        self.assertGreaterEqual(doc["spec"]["replicas"], 2)
        flags = flags_of(container["args"])
        self.assert_etcd_address(flags["etcd"], "router --etcd")
        self.assertNotIn("node_id", flags)
        # Stateless: no claim, nothing mounted at /data.
        self.assertNotIn("volumeClaimTemplates", doc["spec"])
        self.assertFalse([m for m in container.get("volumeMounts", [])
                          if m["mountPath"].rstrip("/") == "/data"])
        self.assertFalse([v for v in pod_spec(doc).get("volumes", [])
                          if "persistentVolumeClaim" in v])
        # Clients' Service selects routers and nothing else.
        service = self.service("tessera")
        self.assertTrue(selects(service["spec"]["selector"], pod_labels(doc)))
        shard = self.role_workloads("shard")[0][0]
        self.assertFalse(selects(service["spec"]["selector"], pod_labels(shard)))
        self.assertTrue(self.budget_for(doc), "no PodDisruptionBudget for the routers")

    def test_cluster_etcd(self):
        doc, container = self.etcd_workload()
        self.assertEqual(doc["kind"], "StatefulSet")
        members, name = doc["spec"]["replicas"], doc["metadata"]["name"]
        headless = doc["spec"]["serviceName"]
        service = self.service(headless)
        self.assertEqual(service["spec"].get("clusterIP"), "None")
        self.assertTrue(service["spec"].get("publishNotReadyAddresses"))
        flags = etcd_flags(container["args"])
        initial = dict(m.split("=", 1) for m in flags["initial-cluster"].split(","))
        self.assertEqual(set(initial), {f"{name}-{i}" for i in range(members)},
                         "--initial-cluster lists every member by pod name")
        # Peers in the scheme the members listen with (https: TLS between members).
        scheme = flags["listen-peer-urls"].split("://")[0]
        for member, url in initial.items():
            self.assertTrue(url.startswith(f"{scheme}://{member}.{headless}."), url)
        self.assertEqual(flags["name"], "$(POD_NAME)")
        self.assertTrue(flags["initial-advertise-peer-urls"].startswith(
            f"{scheme}://$(POD_NAME).{headless}."))
        if scheme == "https":
            for flag in ("peer-cert-file", "peer-key-file", "peer-trusted-ca-file"):
                self.assert_from_secret(doc, container, flags[flag], f"etcd --{flag}")
            self.assertEqual(flags.get("peer-client-cert-auth"), "true",
                             "peers over TLS but any peer may join")
        if members > 1:
            self.assertEqual(doc["spec"].get("podManagementPolicy"), "Parallel")
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        self.assertTrue(any(flags["data-dir"].startswith(m) for m in mounts),
                        "etcd's data dir is on a mounted claim")
        budgets = self.budget_for(doc)
        self.assertTrue(budgets, "no PodDisruptionBudget for etcd")
        quorum = members // 2 + 1
        spec = budgets[0]["spec"]
        if "minAvailable" in spec:
            self.assertGreaterEqual(spec["minAvailable"], quorum)
        else:
            self.assertLessEqual(spec["maxUnavailable"], members - quorum)

    def test_cluster_tls_to_etcd(self):
        """etcd serves its clients over TLS only, from a Secret, and requires client
        certificates; routers and shard nodes pass --etcd_ca (and a client certificate) from a
        mounted Secret."""
        etcd, etcd_container = self.etcd_workload()
        etcd_args = etcd_flags(etcd_container["args"])
        for flag in ("listen-client-urls", "advertise-client-urls"):
            self.assertTrue(etcd_args[flag].startswith("https://"), f"etcd --{flag}")
        for flag in ("cert-file", "key-file", "trusted-ca-file"):
            self.assert_from_secret(etcd, etcd_container, etcd_args[flag], f"etcd --{flag}")
        self.assertEqual(etcd_args.get("client-cert-auth"), "true")
        for role in ("router", "shard"):
            (doc, container), = self.role_workloads(role)
            flags = flags_of(container["args"])
            self.assertIn("etcd_ca", flags, f"{role}: no --etcd_ca, but etcd serves TLS only")
            secret = self.assert_from_secret(doc, container, flags["etcd_ca"], f"{role} --etcd_ca")
            # etcd's --client-cert-auth: a client certificate and its key, from the same Secret.
            for flag in ("etcd_cert", "etcd_key"):
                self.assertIn(flag, flags, f"{role}: no --{flag}, but etcd requires one")
                self.assertEqual(self.assert_from_secret(doc, container, flags[flag],
                                                         f"{role} --{flag}"), secret, flag)

    def test_cluster_tls_between_nodes(self):
        """Shard nodes that serve TLS get their certificate and key from a Secret; routers and
        nodes, which call them, verify them with --cluster_tls_ca; routers do not mount the
        nodes' key."""
        (shard, shard_container), = self.role_workloads("shard")
        shard_flags = flags_of(shard_container["args"])
        if "tls_cert" not in shard_flags:
            self.skipTest("shard nodes serve plaintext")
        node_secret = None
        for flag in ("tls_cert", "tls_key"):
            node_secret = self.assert_from_secret(shard, shard_container, shard_flags[flag],
                                                  f"shard --{flag}")
        for role in ("router", "shard"):
            (doc, container), = self.role_workloads(role)
            flags = flags_of(container["args"])
            self.assertIn("cluster_tls_ca", flags, f"{role}: calls TLS shard nodes in plaintext")
            self.assert_from_secret(doc, container, flags["cluster_tls_ca"],
                                    f"{role} --cluster_tls_ca")
        (router, _), = self.role_workloads("router")
        key = shard_flags["tls_key"].rsplit("/", 1)[1]
        for volume in pod_spec(router).get("volumes", []):
            secret = volume.get("secret", {})
            if secret.get("secretName") == node_secret:
                self.assertIn("items", secret, "routers mount the shard nodes' private key")
                self.assertNotIn(key, {i["key"] for i in secret["items"]},
                                 "routers mount the shard nodes' private key")

    def test_no_private_keys_in_the_repository(self):
        """Secrets are referenced by name and created by the user (deploy/README.md)."""
        for name, docs in self.rendered.items():
            self.assertFalse([d for d in docs if d["kind"] == "Secret"],
                             f"{name}: renders a Secret; reference it by name instead")
        for path in DEPLOY.rglob("*"):
            if path.is_file():
                self.assertNotIn("PRIVATE KEY-----", path.read_text(errors="replace"),
                                 f"{path.relative_to(ROOT)} holds a private key")

    def test_standalone(self):
        for doc, container in self.containers("standalone"):
            flags = flags_of(container.get("args", []))
            self.assertEqual(flags.get("role", "standalone"), "standalone")
            claims = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
            self.assertIn(next(m["name"] for m in container["volumeMounts"]
                               if m["mountPath"] == "/data"), claims)


# -- compose -----------------------------------------------------------------------------------

@skip_without_yaml
class ComposeFiles(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.compose = yaml.safe_load(COMPOSE_CLUSTER.read_text())
        cls.services = cls.compose["services"]
        cls.settings = server_setting_names()
        cls.image = kustomize_image(K8S / "cluster")

    def tessera_services(self):
        return {n: s for n, s in self.services.items() if is_tessera_image(s.get("image", ""))}

    def role(self, role):
        return {n: s for n, s in self.tessera_services().items()
                if flags_of(s["command"]).get("role") == role}

    def named_volume_at(self, service, path):
        for volume in service.get("volumes", []):
            source, _, rest = volume.partition(":")
            target = rest.split(":")[0]
            if target.rstrip("/") == path and not source.startswith((".", "/")):
                return source
        return None

    def test_services(self):
        self.assertEqual(len(self.role("router")), 1)
        self.assertEqual(len(self.role("shard")), 3)
        self.assertIn("etcd", self.services)
        self.assertIn("prometheus", self.services)
        for name, service in self.tessera_services().items():
            self.assertEqual(service["image"], self.image, name)

    def test_shard_nodes(self):
        shards = self.role("shard")
        node_ids, volumes = set(), set()
        for name, service in shards.items():
            flags = flags_of(service["command"])
            self.assertEqual(flags["node_id"], name)
            self.assertEqual(flags["advertise_address"], f"{name}:{GRPC_PORT}")
            self.assert_etcd(flags["etcd"], name)
            volume = self.named_volume_at(service, "/data")
            self.assertIsNotNone(volume, f"{name}: no named volume at /data")
            self.assertIn(volume, self.compose["volumes"])
            node_ids.add(flags["node_id"])
            volumes.add(volume)
        self.assertEqual(len(node_ids), 3, "distinct node ids")
        self.assertEqual(len(volumes), 3, "distinct volumes")

    def assert_etcd(self, value, what):
        host, _, port = value.rpartition(":")
        self.assertIn(host, self.services, f"{what}: --etcd {value}")
        flags = etcd_flags(self.services[host]["command"])
        self.assertEqual(flags["listen-client-urls"].rsplit(":", 1)[1], port, what)
        self.assertIn(host, self.services[what].get("depends_on", []), what)

    def test_router(self):
        (name, service), = self.role("router").items()
        flags = flags_of(service["command"])
        self.assert_etcd(flags["etcd"], name)
        self.assertNotIn("node_id", flags)
        self.assertIsNone(self.named_volume_at(service, "/data"), "the router holds no data")

    def test_published_ports(self):
        published = {}
        for name, service in self.services.items():
            for port in service.get("ports", []):
                self.assertTrue(str(port).startswith("127.0.0.1:"),
                                f"{name}: {port} is published beyond loopback")
                published.setdefault(name, []).append(int(str(port).rsplit(":", 1)[1]))
        (router, _), = self.role("router").items()
        self.assertEqual(published, {router: [GRPC_PORT], "prometheus": [9090]})

    def test_podman_compose_1_0_compatible(self):
        for name, service in self.services.items():
            depends = service.get("depends_on", [])
            self.assertIsInstance(depends, list, f"{name}: depends_on with conditions")
            for dependency in depends:
                self.assertIn(dependency, self.services, name)
            self.assertNotIn("profiles", service, name)

    def test_flags_config_and_grace(self):
        for name, service in self.tessera_services().items():
            flags = flags_of(service["command"])
            if self.settings:
                for flag in flags:
                    self.assertIn(flag, self.settings | {"config"}, f"{name}: --{flag}")
            # Listening on 0.0.0.0 (the entrypoint) needs TLS or --insecure.
            self.assertTrue(flags.get("insecure") == "true" or "tls_cert" in flags, name)
            config = {}
            if "config" in flags:
                mounts = [v.split(":") for v in service.get("volumes", [])]
                source = next((m[0] for m in mounts if m[1] == flags["config"]), None)
                self.assertIsNotNone(source, f"{name}: --config {flags['config']} not mounted")
                path = (COMPOSE_CLUSTER.parent / source).resolve()
                self.assertTrue(path.exists(), f"{name}: {source} does not exist")
                config = yaml.safe_load(path.read_text())
            grace = float(config.get("shutdown_grace_seconds", DEFAULT_SHUTDOWN_GRACE))
            stop = str(service.get("stop_grace_period", "10s"))
            self.assertTrue(stop.endswith("s") and float(stop[:-1]) > grace, name)
            self.assertEqual(service.get("stop_signal"), "SIGTERM", name)

    def test_prometheus_scrapes_every_node(self):
        prometheus = self.services["prometheus"]
        source = next(v.split(":")[0] for v in prometheus["volumes"] if "prometheus.yml" in v)
        config = yaml.safe_load((COMPOSE_CLUSTER.parent / source).read_text())
        targets = {t for job in config["scrape_configs"] for group in job.get("static_configs", [])
                   for t in group["targets"]}
        for name in self.tessera_services():
            self.assertIn(f"{name}:{METRICS_PORT}", targets, f"{name} is not scraped")
        etcd_metrics = etcd_flags(self.services["etcd"]["command"]).get("listen-metrics-urls")
        if etcd_metrics:
            self.assertIn(f"etcd:{etcd_metrics.rsplit(':', 1)[1]}", targets)
        for target in targets:
            host = target.rsplit(":", 1)[0]
            self.assertTrue(host in self.services or host == "localhost",
                            f"prometheus.yml: unknown target {target}")

    def test_single_node_compose(self):
        compose = yaml.safe_load(COMPOSE_SINGLE.read_text())
        (name, service), = compose["services"].items()
        self.assertEqual(service["image"], self.image)
        self.assertIsNotNone(self.named_volume_at(service, "/data"))
        self.assertEqual(flags_of(service["command"]).get("role", "standalone"), "standalone")
        for port in service["ports"]:
            self.assertTrue(str(port).startswith("127.0.0.1:"))
        self.assertIn("deploy/compose/compose.yaml", COMPOSE_SINGLE.read_text(),
                      "the single-node file points at the cluster one")


# -- the example config and the docs -----------------------------------------------------------

@skip_without_yaml
class ConfigAndDocs(unittest.TestCase):

    def test_example_config_has_every_setting(self):
        settings = server_setting_names()
        if not settings:
            self.skipTest("no setting names found in server/config.cc")
        text = SERVER_CONFIG.read_text()
        keys = set(yaml.safe_load(text))
        self.assertFalse(keys - settings, f"unknown keys in {SERVER_CONFIG.name}")
        for missing in settings - keys:  # settings without a default appear commented out
            self.assertRegex(text, rf"(?m)^# {missing}: ", f"{missing} is not documented")

    def test_cited_deploy_paths_exist(self):
        files = [ROOT / "README.md", *DEPLOY.rglob("*.md"), *DEPLOY.rglob("*.yaml"),
                 *DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.sh"), *(ROOT / "docs").rglob("*.md"),
                 *(ROOT / "scripts").glob("*"), ROOT / "Dockerfile"]
        for path in files:
            if not path.is_file():
                continue
            text = path.read_text(errors="replace")
            for cited in re.findall(r"deploy/(?:k8s|compose)[\w./-]*", text):
                cited = cited.rstrip(".")
                self.assertTrue((ROOT / cited).exists(),
                                f"{path.relative_to(ROOT)} cites {cited}, which does not exist")


if __name__ == "__main__":
    unittest.main()
