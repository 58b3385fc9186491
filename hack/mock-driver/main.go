// Command csi-mock-driver serves the Kubernetes end-to-end mock CSI driver (Identity, Controller
// and Node services) on a unix socket, for the sidecar's integration tests. The driver itself is
// the e2e suite's; this program only maps flags onto its Config, logs every call (requestlog.go)
// and removes the socket on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// gracePeriod bounds how long a shutdown waits for calls in flight before it cuts them off.
const gracePeriod = 5 * time.Second

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "csi-mock-driver: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	endpoint := flag.String("endpoint", "", "unix socket to serve on: a path or unix://<path> (required)")
	driverName := flag.String("driver-name", service.Name,
		"driver name reported by GetPluginInfo; the mock also uses it as its node id (NodeGetInfo, ControllerPublishVolume)")
	topology := flag.Bool("enable-topology", false,
		"report VOLUME_ACCESSIBILITY_CONSTRAINTS; volumes and the node get the mock's fixed segment "+
			service.TopologyKey+"="+service.TopologyValue)
	attachRequired := flag.Bool("attach-required", true,
		"report PUBLISH_UNPUBLISH_VOLUME and serve ControllerPublish/UnpublishVolume (false: Unimplemented)")
	attachLimit := flag.Int64("attach-limit", 0,
		"max_volumes_per_node in NodeGetInfo and the ControllerPublishVolume limit (0: no limit)")
	nodeExpansion := flag.Bool("node-expansion-required", false,
		"ControllerExpandVolume asks for node expansion; the node reports EXPAND_VOLUME")
	controllerExpansion := flag.Bool("controller-expansion", true, "report the controller's EXPAND_VOLUME")
	onlineExpansion := flag.Bool("online-expansion", true,
		"report ONLINE volume expansion (false: OFFLINE, and expanding a published volume fails)")
	volumeCondition := flag.Bool("node-volume-condition", false, "the node reports VOLUME_CONDITION")
	volumeMountGroup := flag.Bool("volume-mount-group", false, "the node reports VOLUME_MOUNT_GROUP")
	permissiveTargetPath := flag.Bool("permissive-target-path", false,
		"NodePublishVolume accepts a target path that already exists")
	flag.Parse()

	socket := strings.TrimPrefix(*endpoint, "unix://")
	if socket == "" {
		return errors.New("--endpoint is required")
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", flag.Args())
	}

	driver := service.New(service.Config{
		DriverName:                  *driverName,
		EnableTopology:              *topology,
		DisableAttach:               !*attachRequired,
		AttachLimit:                 *attachLimit,
		NodeExpansionRequired:       *nodeExpansion,
		DisableControllerExpansion:  !*controllerExpansion,
		DisableOnlineExpansion:      !*onlineExpansion,
		NodeVolumeConditionRequired: *volumeCondition,
		VolumeMountGroupRequired:    *volumeMountGroup,
		PermissiveTargetPath:        *permissiveTargetPath,
	})

	// A socket left by a killed run refuses connections and would make Listen fail.
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the stale socket %s: %w", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", socket, err)
	}
	server := grpc.NewServer(grpc.UnaryInterceptor(newRequestLog(os.Stdout).intercept))
	csi.RegisterIdentityServer(server, driver)
	csi.RegisterControllerServer(server, driver)
	csi.RegisterNodeServer(server, driver)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	fmt.Fprintf(os.Stderr, "csi-mock-driver: %s serving on %s\n", *driverName, socket)

	select {
	case err := <-served:
		return fmt.Errorf("serving on %s: %w", socket, err)
	case <-ctx.Done():
	}
	fmt.Fprintln(os.Stderr, "csi-mock-driver: signalled, shutting down")
	graceful := make(chan struct{})
	go func() { server.GracefulStop(); close(graceful) }()
	select {
	case <-graceful:
	case <-time.After(gracePeriod):
		server.Stop()
	}
	// Closing the listener (in Stop) unlinks the socket already; this covers a listener that
	// did not.
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the socket %s: %w", socket, err)
	}
	return nil
}
