// grpc-health: the gRPC workload of the control-plane tests' pods. It serves the standard grpc.health.v1 Health
// service on -listen, SERVING for the whole server ("") and for -service, and exits on SIGTERM. Built into a test
// image by hack/build-test-workloads.sh (statically, so the image needs nothing else).
package main

import (
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	listen := flag.String("listen", ":9090", "address to serve on")
	service := flag.String("service", "", "a service name answered SERVING besides the server's own")
	flag.Parse()

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen %s: %v", *listen, err)
	}
	server := grpc.NewServer()
	checker := health.NewServer()
	checker.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if *service != "" {
		checker.SetServingStatus(*service, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(server, checker)

	// A pod's container gets SIGTERM first: stop at once (a test pod's grace period is short).
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	log.Printf("serving grpc.health.v1 on %s", lis.Addr())
	if err := server.Serve(lis); err != nil {
		log.Fatalf("serve: %v", err)
	}
}
