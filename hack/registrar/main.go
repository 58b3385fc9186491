// csi-registrar registers a CSI driver's node plugin with the kubelet: it serves the kubelet's
// plugin-registration API (pluginregistration.v1, k8s.io/kubelet) on
// <plugin-registration-path>/<driver name>-reg.sock, telling the kubelet the driver's name (asked
// from the driver with GetPluginInfo) and where the kubelet finds its CSI socket on the host.
//
// It stands in for kubernetes-csi/node-driver-registrar, which the Go module proxy here does not
// serve, with the same flag names for what it does. It is Go because the kubelet dials the
// registration socket without an :authority header fit for HTTP/2, which Rust's h2 server (and
// so any tonic server) rejects with PROTOCOL_ERROR; grpc-go accepts it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver   string
	endpoint string
	failed   chan<- string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("the kubelet asked for the plugin's info: %s at %s", r.driver, r.endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, status *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if status.PluginRegistered {
		log.Printf("the kubelet registered %s", r.driver)
	} else {
		// Restarting is the way to try again: the kubelet registers a socket when it appears.
		r.failed <- status.Error
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// driverName asks the driver for its name, retrying until it answers (it may start later).
func driverName(ctx context.Context, address string) (string, error) {
	conn, err := grpc.NewClient("unix:"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", address, err)
	}
	defer conn.Close()
	identity := csi.NewIdentityClient(conn)
	for {
		call, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := identity.GetPluginInfo(call, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && info.GetName() != "" {
			return info.GetName(), nil
		}
		log.Printf("waiting for the driver at %s to answer GetPluginInfo: %v", address, err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func main() {
	csiAddress := flag.String("csi-address", "/csi/csi.sock", "the driver's CSI socket in this container")
	kubeletPath := flag.String("kubelet-registration-path", "", "the driver's CSI socket as the kubelet sees it on the host (required)")
	registrationDir := flag.String("plugin-registration-path", "/registration", "the kubelet's plugins_registry directory in this container")
	flag.Parse()
	if *kubeletPath == "" {
		fmt.Fprintln(os.Stderr, "csi-registrar: --kubelet-registration-path is required")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	name, err := driverName(ctx, *csiAddress)
	if err != nil {
		log.Fatalf("csi-registrar: %v", err)
	}
	socket := filepath.Join(*registrationDir, name+"-reg.sock")
	// A socket left by an earlier instance would refuse the bind; the kubelet sees the new one.
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Fatalf("csi-registrar: removing %s: %v", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("csi-registrar: %v", err)
	}
	failed := make(chan string, 1)
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, &registrar{driver: name, endpoint: *kubeletPath, failed: failed})
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Printf("csi-registrar: serving: %v", err)
		}
	}()
	log.Printf("serving the registration of %s on %s", name, socket)
	code := 0
	select {
	case <-ctx.Done():
	case reason := <-failed:
		log.Printf("csi-registrar: the kubelet did not register %s: %s", name, reason)
		code = 1
	}
	server.Stop()
	_ = os.Remove(socket)
	os.Exit(code)
}
