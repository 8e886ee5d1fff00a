"""The pod the webhook's tests admit: shared by the admission decision's tests and the served webhook's."""

from __future__ import annotations


def web_pod(**extra_spec) -> dict:
    """A typical Deployment's pod as the API server has it at admission (generateName, defaults applied)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-7d4b9c-", "namespace": "shop",
                     "labels": {"app": "web", "pod-template-hash": "7d4b9c"}},
        "spec": {"containers": [{
            "name": "web", "image": "shop/web:1.4", "ports": [{"name": "http", "containerPort": 8080,
                                                               "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP"},
                               "periodSeconds": 5, "timeoutSeconds": 1, "successThreshold": 1,
                               "failureThreshold": 3},
            "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 10, "timeoutSeconds": 2,
                              "successThreshold": 1, "failureThreshold": 3},
            "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http", "scheme": "HTTP"}}},
            "resources": {}, "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent",
        }], "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            **extra_spec},
    }
