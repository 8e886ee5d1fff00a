"""The mutating admission webhook (`probe-shim webhook`): pods converted at admission with `probectl convert`'s
own code, so a cluster adopts the bridge without rewriting its manifests. See README "Rolling out to a cluster"."""
