"""The mutating admission webhook (`probe-shim webhook`): pods converted at admission by `probectl convert`'s own
rule (probe_api/pod_conversion.py), so a cluster adopts the bridge without rewriting its manifests. See
docs/rollout.md."""
