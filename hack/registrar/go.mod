module local.invalid/csi-registrar

go 1.26.0

require (
	github.com/container-storage-interface/spec v1.9.0
	google.golang.org/grpc v1.79.3
	k8s.io/kubelet v0.36.3
)

require (
	github.com/golang/protobuf v1.5.4 // indirect
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.40.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260128011058-8636f8732409 // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)
