"""The kubelet bridge: exec probes and exec lifecycle hooks whose command names the shim, answered in the pod's netns.

`command` reads the marker command (pure), `answer` turns an attempt into the ExecSync answer (pure),
`containers` resolves a container to its sandbox over CRI, and `service` runs the whole call.
"""
