// A gRPC server for the grpc-gateway and grpc-web JSON tests: the services of Kong's own
// fixtures (spec/fixtures/grpc/targetservice.proto, which Kong's grpc-gateway spec calls, and
// hello.proto, which its grpc-web spec calls), served by grpc-go as Kong's fixture server
// (spec/fixtures/grpc/target/grpc-target.go) serves them. The .proto files are compiled when
// it starts (bufbuild/protocompile, a compiler other than the gateway's) and the messages are
// dynamic (dynamicpb), so no generated code is needed.
//
// Usage: target PORT INCLUDE_DIR...   (prints "listening" once it accepts calls)
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/bufbuild/protocompile"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

func field(m *dynamicpb.Message, name string) protoreflect.FieldDescriptor {
	f := m.Descriptor().Fields().ByName(protoreflect.Name(name))
	if f == nil {
		log.Fatalf("%s has no field %s", m.Descriptor().FullName(), name)
	}
	return f
}

func str(m *dynamicpb.Message, name string) string { return m.Get(field(m, name)).String() }

func setStr(m *dynamicpb.Message, name, v string) {
	m.Set(field(m, name), protoreflect.ValueOfString(v))
}

func stamp(m *dynamicpb.Message, name string) time.Time {
	t := m.Get(field(m, name)).Message()
	secs := t.Get(t.Descriptor().Fields().ByName("seconds")).Int()
	nanos := t.Get(t.Descriptor().Fields().ByName("nanos")).Int()
	return time.Unix(secs, nanos).UTC()
}

// One call: the request in, the replies out (several for a server stream).
func handle(name string, in *dynamicpb.Message, out func() *dynamicpb.Message) ([]*dynamicpb.Message, error) {
	switch name {
	case "/targetservice.Bouncer/SayHello", "/hello.HelloService/SayHello":
		o := out()
		setStr(o, "reply", "hello "+str(in, "greeting"))
		if f := o.Descriptor().Fields().ByName("boolean_test"); f != nil {
			o.Set(f, in.Get(field(in, "boolean_test")))
		}
		return []*dynamicpb.Message{o}, nil
	case "/hello.HelloService/LotsOfReplies":
		var replies []*dynamicpb.Message
		for i := 0; i < 3; i++ {
			o := out()
			setStr(o, "reply", fmt.Sprintf("hello %s %d", str(in, "greeting"), i))
			replies = append(replies, o)
		}
		return replies, nil
	case "/targetservice.Bouncer/BounceIt":
		w, now := stamp(in, "when"), stamp(in, "now")
		o := out()
		setStr(o, "reply", "hello "+str(in, "message"))
		setStr(o, "time_message", fmt.Sprintf("%s was %v ago", w.Format(time.RFC3339), now.Sub(w).Truncate(time.Second)))
		o.Set(field(o, "now"), in.Get(field(in, "now")))
		return []*dynamicpb.Message{o}, nil
	case "/targetservice.Bouncer/GrowTail":
		tail := in.Mutable(field(in, "tail")).Message()
		count := tail.Descriptor().Fields().ByName("count")
		tail.Set(count, protoreflect.ValueOfInt32(int32(tail.Get(count).Int())+1))
		return []*dynamicpb.Message{in}, nil
	case "/targetservice.Bouncer/Echo":
		return []*dynamicpb.Message{in}, nil
	}
	return nil, status.Errorf(codes.Unimplemented, "method %s not implemented", name)
}

func main() {
	if len(os.Args) < 3 {
		log.Fatal("usage: target PORT INCLUDE_DIR...")
	}
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: os.Args[2:]}),
	}
	files, err := compiler.Compile(context.Background(), "targetservice.proto", "hello.proto")
	if err != nil {
		log.Fatalf("compiling the .proto files: %v", err)
	}
	methods := map[string]protoreflect.MethodDescriptor{}
	for _, f := range files {
		for i := 0; i < f.Services().Len(); i++ {
			s := f.Services().Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				m := s.Methods().Get(j)
				methods[fmt.Sprintf("/%s/%s", s.FullName(), m.Name())] = m
			}
		}
	}
	server := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		name, _ := grpc.MethodFromServerStream(stream)
		md, ok := methods[name]
		if !ok {
			return status.Errorf(codes.Unimplemented, "unknown method %s", name)
		}
		in := dynamicpb.NewMessage(md.Input())
		if err := stream.RecvMsg(in); err != nil {
			return err
		}
		replies, err := handle(name, in, func() *dynamicpb.Message { return dynamicpb.NewMessage(md.Output()) })
		if err != nil {
			return err
		}
		for _, r := range replies {
			if err := stream.SendMsg(r); err != nil {
				return err
			}
		}
		return nil
	}))
	lis, err := net.Listen("tcp", "127.0.0.1:"+os.Args[1])
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	fmt.Println("listening")
	if err := server.Serve(lis); err != nil {
		log.Fatalf("serve: %v", err)
	}
}
