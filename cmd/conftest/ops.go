package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
)

// ops prints which registered backend implements which op. Each backend is
// built as a world of one rank and every op is called with empty
// arguments: an op it does not implement answers ErrUnsupported (the
// generated Unimplemented) before looking at them; anything else, an
// argument error included, means the op is there.
func ops(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("ops takes no arguments")
	}
	names := backend.Drivers()
	cols := make([]map[backend.Op]string, len(names))
	notes := make([]string, len(names))
	for i, name := range names {
		cols[i], notes[i] = probeBackend(name)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "op\tkind\t%s\n", strings.Join(names, "\t"))
	for _, op := range backend.Ops() {
		row := []string{op.String(), op.Info().Kind.String()}
		for i := range names {
			row = append(row, cols[i][op])
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, n := range notes {
		if n != "" {
			fmt.Printf("%s: %s\n", names[i], n)
		}
	}
	fmt.Println("yes: implemented; -: ErrUnsupported; ?: backend unavailable here")
	return nil
}

func probeBackend(name string) (map[backend.Op]string, string) {
	out := map[backend.Op]string{}
	drv, _ := backend.Lookup(name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := drv.New(ctx, backend.Config{Store: store.NewHashStore(), Rank: 0, WorldSize: 1, GroupName: "0", GroupDesc: "conftest_ops", Timeout: 5 * time.Second})
	if err != nil {
		for _, op := range backend.Ops() {
			out[op] = "?"
		}
		return out, "unavailable: " + err.Error()
	}
	defer b.Close(ctx)
	v := reflect.ValueOf(b)
	for _, op := range backend.Ops() {
		m := v.MethodByName(op.Info().GoName)
		if !m.IsValid() {
			out[op] = "-"
			continue
		}
		out[op] = "yes"
		if isUnsupported(callZero(ctx, m)) {
			out[op] = "-"
		}
	}
	return out, ""
}

// callZero calls a Backend method with zero arguments after ctx, and
// returns its error (a panic on nil arguments counts as implemented).
func callZero(ctx context.Context, m reflect.Value) (err error) {
	defer func() {
		if recover() != nil {
			err = nil
		}
	}()
	t := m.Type()
	in := make([]reflect.Value, t.NumIn())
	in[0] = reflect.ValueOf(ctx)
	for i := 1; i < len(in); i++ {
		in[i] = reflect.Zero(t.In(i))
	}
	res := m.Call(in)
	if e, ok := res[len(res)-1].Interface().(error); ok {
		return e
	}
	if w, ok := res[0].Interface().(backend.Work); ok && w != nil {
		_ = w.WaitHost(ctx)
	}
	return nil
}

func isUnsupported(err error) bool { return errors.Is(err, backend.ErrUnsupported) }
