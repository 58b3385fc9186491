package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// redacted replaces every value of a `secrets` map in the log; the keys stay visible.
const redacted = "***redacted***"

// callLine is one line of the request log: a finished call. Tests parse these lines (one JSON
// object each) to compare the requests a driver received.
type callLine struct {
	Method   string          `json:"method"`
	Request  json.RawMessage `json:"request"`
	Code     string          `json:"code"`
	Message  string          `json:"message,omitempty"`
	Response json.RawMessage `json:"response,omitempty"`
}

// requestLog writes a callLine for every unary call, and runs one call at a time.
type requestLog struct {
	out io.Writer
	// Held for a whole call, not only the write: the mock looks a volume up by name and adds it
	// in two separate critical sections, so two concurrent CreateVolume calls of one name (a
	// sidecar retrying after a timeout) could create two volumes. One call at a time makes it
	// idempotent, as a real driver is; the mock never blocks, so nothing waits for long.
	mu sync.Mutex
}

func newRequestLog(out io.Writer) *requestLog {
	return &requestLog{out: out}
}

// protoNames writes the spec's field names (volume_capabilities, not volumeCapabilities), as the
// CSI spec and the sidecar's own messages spell them.
var protoNames = protojson.MarshalOptions{UseProtoNames: true}

func (l *requestLog) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	resp, err := handler(ctx, req)
	st := status.Convert(err)
	line := callLine{
		Method:  info.FullMethod,
		Request: messageJSON(req),
		Code:    st.Code().String(),
		Message: st.Message(),
	}
	if err == nil {
		line.Response = messageJSON(resp)
	}
	encoded, marshalErr := json.Marshal(line)
	if marshalErr != nil {
		fmt.Fprintf(os.Stderr, "csi-mock-driver: logging %s: %v\n", info.FullMethod, marshalErr)
		return resp, err
	}
	// json.Marshal compacts the raw messages, so this is one line.
	if _, writeErr := l.out.Write(append(encoded, '\n')); writeErr != nil {
		fmt.Fprintf(os.Stderr, "csi-mock-driver: logging %s: %v\n", info.FullMethod, writeErr)
	}
	return resp, err
}

// messageJSON is a request or response as protojson with its secrets redacted; a JSON string
// with the error for something that is not a protobuf message or does not encode.
func messageJSON(m any) json.RawMessage {
	// The CSI spec's Go package (v1.9.0) is generated for the old github.com/golang/protobuf
	// API, whose messages have no ProtoReflect; the adapter wraps them for protoreflect and
	// protojson.
	legacy, ok := m.(protoadapt.MessageV1)
	if !ok {
		return quoted(fmt.Sprintf("not a protobuf message: %T", m))
	}
	// A copy: the handler's response is still to be sent as it is.
	message := proto.Clone(protoadapt.MessageV2Of(legacy))
	redactSecrets(message.ProtoReflect())
	encoded, err := protoNames.Marshal(message)
	if err != nil {
		return quoted(fmt.Sprintf("encoding %T: %v", m, err))
	}
	return encoded
}

func quoted(text string) json.RawMessage {
	encoded, _ := json.Marshal(text) // a string always encodes
	return encoded
}

// redactSecrets replaces the values of every map<string, string> field named `secrets`, at any
// depth (CSI puts them on requests, and a future message may nest them).
func redactSecrets(m protoreflect.Message) {
	m.Range(func(field protoreflect.FieldDescriptor, value protoreflect.Value) bool {
		switch {
		case field.IsMap() && field.Name() == "secrets" && field.MapValue().Kind() == protoreflect.StringKind:
			// Keys first: a map is not to be changed while ranging over it.
			secrets := value.Map()
			var keys []protoreflect.MapKey
			secrets.Range(func(key protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, key)
				return true
			})
			for _, key := range keys {
				secrets.Set(key, protoreflect.ValueOfString(redacted))
			}
		case field.IsMap() && field.MapValue().Message() != nil:
			value.Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
				redactSecrets(v.Message())
				return true
			})
		case field.IsList() && field.Message() != nil:
			list := value.List()
			for i := 0; i < list.Len(); i++ {
				redactSecrets(list.Get(i).Message())
			}
		case field.Message() != nil && !field.IsMap() && !field.IsList():
			redactSecrets(value.Message())
		}
		return true
	})
}
