module local.invalid/containerd-bin

go 1.26.6

require github.com/containerd/containerd/v2 v2.4.2 // indirect
