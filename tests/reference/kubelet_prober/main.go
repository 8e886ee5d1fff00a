// Command kubelet-prober runs probes with the kubelet's own prober code, as the reference the project's engine is
// compared with (tests/system/test_kubelet_prober_reference.py).
//
// It reads one JSON object on stdin,
//
//	{"cases": [{"name": "...", "podIP": "198.18.0.2", "container": <core/v1 Container>, "probe": <core/v1 Probe>}]}
//
// runs each probe's handler as pkg/kubelet/prober/prober.go runProbeWithRetries and runProbe do (exec excepted:
// it is the runtime's), with the probers newProber makes (pkg/probe/http New(false), tcp, grpc) and the request
// pkg/probe/http NewRequestForHTTPGetAction builds (User-Agent kube-probe/MAJOR.MINOR from component-base's
// version, stamped at build time), and prints
//
//	{"gitVersion": "v1.37.2", "results": [{"name": "...", "result": "success|warning|failure|unknown",
//	  "output": "...", "error": "...", "tries": 1, "seconds": 0.01}]}
//
// in the cases' order. The alpha gates of the probe features the engine has (H2CContainerProbe,
// GRPCContainerProbeTLS) are on. Cases run concurrently (-parallel), each on its own timeout.
//
// Built by hack/build-kubelet-prober.sh, outside the work tree.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/version"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/probe"
	grpcprobe "k8s.io/kubernetes/pkg/probe/grpc"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"
	tcpprobe "k8s.io/kubernetes/pkg/probe/tcp"
)

// pkg/kubelet/prober/prober.go
const maxProbeRetries = 3

type probeCase struct {
	Name      string       `json:"name"`
	PodIP     string       `json:"podIP"`
	Container v1.Container `json:"container"`
	Probe     v1.Probe     `json:"probe"`
}

type caseResult struct {
	Name    string  `json:"name"`
	Result  string  `json:"result"`
	Output  string  `json:"output"`
	Error   string  `json:"error"`
	Tries   int     `json:"tries"`
	Seconds float64 `json:"seconds"`
}

// prober holds what newProber (pkg/kubelet/prober/prober.go) makes, exec aside.
type prober struct {
	http httpprobe.Prober
	tcp  tcpprobe.Prober
	grpc grpcprobe.Prober
}

func newProber() *prober {
	const followNonLocalRedirects = false
	return &prober{
		http: httpprobe.New(followNonLocalRedirects),
		tcp:  tcpprobe.New(),
		grpc: grpcprobe.New(),
	}
}

// runProbeWithRetries is prober.go's, without the pod and container bookkeeping; it also counts the tries.
func (pb *prober) runProbeWithRetries(c *probeCase, retries int) (probe.Result, string, error, int) {
	var err error
	var result probe.Result
	var output string
	for i := 0; i < retries; i++ {
		result, output, err = pb.runProbe(c)
		if err == nil {
			return result, output, nil, i + 1
		}
	}
	return result, output, err, retries
}

// runProbe is prober.go's for the httpGet, tcpSocket and grpc handlers, line for line but for the logging.
func (pb *prober) runProbe(c *probeCase) (probe.Result, string, error) {
	p := &c.Probe
	container := c.Container
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	switch {
	case p.HTTPGet != nil:
		req, err := httpprobe.NewRequestForHTTPGetAction(p.HTTPGet, &container, c.PodIP, "probe")
		if err != nil {
			return probe.Unknown, "", err
		}
		if p.HTTPGet.Protocol != nil && *p.HTTPGet.Protocol == v1.HTTPProtocolHTTP2 &&
			utilfeature.DefaultFeatureGate.Enabled(features.H2CContainerProbe) {
			return pb.http.ProbeH2C(req, timeout)
		}
		return pb.http.Probe(req, timeout)

	case p.TCPSocket != nil:
		port, err := probe.ResolveContainerPort(p.TCPSocket.Port, &container)
		if err != nil {
			return probe.Unknown, "", err
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = c.PodIP
		}
		return pb.tcp.Probe(host, port, timeout)

	case p.GRPC != nil:
		host := c.PodIP
		service := ""
		if p.GRPC.Service != nil {
			service = *p.GRPC.Service
		}
		useTLS := utilfeature.DefaultFeatureGate.Enabled(features.GRPCContainerProbeTLS) &&
			p.GRPC.Mode != nil && *p.GRPC.Mode == v1.GRPCProbeModeTLS
		return pb.grpc.Probe(host, service, int(p.GRPC.Port), timeout, grpcprobe.ProbeOptions{UseTLS: useTLS})

	default:
		return probe.Unknown, "", fmt.Errorf("missing probe handler for %s", c.Name)
	}
}

func main() {
	parallel := flag.Int("parallel", 8, "cases run at once")
	flag.Parse()
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{
		string(features.H2CContainerProbe):     true,
		string(features.GRPCContainerProbeTLS): true,
	}); err != nil {
		fail(err)
	}
	var input struct {
		Cases []probeCase `json:"cases"`
	}
	decoder := json.NewDecoder(os.Stdin)
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&input); err != nil {
		fail(fmt.Errorf("reading the cases: %w", err))
	}

	pb := newProber()
	results := make([]caseResult, len(input.Cases))
	slots := make(chan struct{}, max(*parallel, 1))
	var wg sync.WaitGroup
	for i := range input.Cases {
		wg.Add(1)
		slots <- struct{}{}
		go func(i int) {
			defer func() { <-slots; wg.Done() }()
			c := &input.Cases[i]
			started := time.Now()
			result, output, err, tries := pb.runProbeWithRetries(c, maxProbeRetries)
			r := caseResult{Name: c.Name, Result: string(result), Output: output, Tries: tries,
				Seconds: time.Since(started).Seconds()}
			if err != nil {
				r.Error = err.Error()
			}
			results[i] = r
		}(i)
	}
	wg.Wait()

	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	if err := out.Encode(map[string]any{"gitVersion": version.Get().GitVersion, "results": results}); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kubelet-prober:", err)
	os.Exit(2)
}
