// Package knob resolves gocoll's configuration knobs with one rule, the same
// in the dispatcher and in every backend:
//
//  1. an option field that is set (not its type's zero value) wins;
//  2. else the first of the knob's environment variables that is set to a
//     non-empty value (GOCOLL_ name first, then the TORCH_/TORCH_NCCL_ and
//     legacy aliases);
//  3. else the default.
//
// So the zero value of every options struct means "the defaults, as the
// environment may change them". A knob whose zero is itself a useful
// setting cannot say it with the zero value; such knobs use a negative
// number for it ("negative means off"), documented on the field.
//
// Invalid values, from a field or from the environment, are errors that
// name the field or the variable and the value, so that constructors can
// reject them before the first op. Booleans are parsed one way everywhere
// (ParseBool).
package knob

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Env looks up an environment variable, as os.LookupEnv does. Resolution
// takes it as an argument so that it is a pure function of its inputs:
// constructors pass OS, tests pass Map.
type Env func(name string) (string, bool)

// OS reads the process environment.
var OS Env = os.LookupEnv

// Map is an environment made of m, for tests.
func Map(m map[string]string) Env {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// Lookup returns the first of names that is set to a non-empty value, and
// that value. An empty value counts as unset, as an empty TORCH_ variable
// does in PyTorch.
func (e Env) Lookup(names ...string) (name, value string, ok bool) {
	for _, n := range names {
		if v, ok := e(n); ok && v != "" {
			return n, v, true
		}
	}
	return "", "", false
}

// ErrInvalid is wrapped by every *Error.
var ErrInvalid = errors.New("invalid value")

// Error is an invalid value of a knob.
type Error struct {
	// Name is the variable (GOCOLL_NCCL_BLOCKING_WAIT) or the field
	// (nccl.Options.RanksPerRoot) that held the value.
	Name string
	// Value is the value as given: the variable's text, quoted, or the
	// field's value (quoted when it is a string).
	Value string
	// Want says what would have been accepted.
	Want string
}

// Error implements error: NAME=value: want ....
func (e *Error) Error() string {
	return fmt.Sprintf("%s=%s: want %s", e.Name, e.Value, e.Want)
}

// Unwrap returns ErrInvalid.
func (e *Error) Unwrap() error { return ErrInvalid }

// Want is the error that Parse and Check functions return to say what
// they accept; Resolve turns it into an *Error naming the source.
type Want string

// Error implements error.
func (w Want) Error() string { return string(w) }

// Knob is one setting: an option field, the environment variables that
// stand in for it when the field is zero, and its default.
//
// T's zero value means "not set", so Resolve cannot be told "false" or "0"
// through the field: a bool knob must default to false (name the field
// for the non-default case: Disable, NoDumpOnError), and a number whose
// zero is meaningful must say it another way (negative).
type Knob[T comparable] struct {
	// Field names the option field in errors, e.g. "nccl.Options.RanksPerRoot".
	Field string
	// Env are the variables read when the field is zero, in order of
	// precedence. Empty: the knob has no variable.
	Env []string
	// Default is the value when neither the field nor a variable is set.
	Default T
	// Parse converts a variable's text. Nil: T must be string, used as is.
	// Its error says what it wants (return a Want).
	Parse func(string) (T, error)
	// Check, if not nil, validates a set field and a parsed variable (not
	// Default). Its error says what it wants (return a Want).
	Check func(T) error
}

// Resolve applies the precedence rule to the field's value.
func (k Knob[T]) Resolve(env Env, field T) (T, error) {
	var zero T
	if field != zero {
		if k.Check != nil {
			if err := k.Check(field); err != nil {
				return zero, &Error{Name: k.Field, Value: show(field), Want: want(err)}
			}
		}
		return field, nil
	}
	name, raw, ok := env.Lookup(k.Env...)
	if !ok {
		return k.Default, nil
	}
	var v T
	if k.Parse == nil {
		s, isString := any(raw).(T)
		if !isString {
			panic("knob: " + k.Field + ": Parse is nil but the knob is not a string")
		}
		v = s
	} else {
		var err error
		if v, err = k.Parse(raw); err != nil {
			return zero, &Error{Name: name, Value: strconv.Quote(raw), Want: want(err)}
		}
	}
	if k.Check != nil {
		if err := k.Check(v); err != nil {
			return zero, &Error{Name: name, Value: strconv.Quote(raw), Want: want(err)}
		}
	}
	return v, nil
}

func show(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

func want(err error) string {
	var w Want
	if errors.As(err, &w) {
		return string(w)
	}
	return err.Error()
}

// ParseBool is the one boolean syntax of every knob, case-insensitive:
// 1, true, t, yes, y, on for true; 0, false, f, no, n, off for false
// (PyTorch's getCvarBool words, and on/off). Anything else is an error.
func ParseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "1", "true", "t", "yes", "y", "on":
		return true, nil
	case "0", "false", "f", "no", "n", "off":
		return false, nil
	}
	return false, Want("a boolean (1/0, true/false, yes/no, on/off)")
}

// Not parses a boolean and negates it: for a variable that enables what a
// field disables (GOCOLL_ENABLE_MONITORING=0 sets MonitorOptions.Disable).
func Not(s string) (bool, error) {
	b, err := ParseBool(s)
	return !b, err
}

// ParseInt parses a decimal integer.
func ParseInt(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, Want("an integer")
	}
	return n, nil
}

// Units returns a parser of a whole number of unit (a variable in seconds:
// Units(time.Second)).
func Units(unit time.Duration) func(string) (time.Duration, error) {
	return func(s string) (time.Duration, error) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, Want("an integer number of " + unitName(unit))
		}
		return time.Duration(n) * unit, nil
	}
}

func unitName(unit time.Duration) string {
	switch unit {
	case time.Second:
		return "seconds"
	case time.Millisecond:
		return "milliseconds"
	}
	return unit.String() + "s"
}

// Positive is a Check that accepts numbers above zero.
func Positive[T int | int64 | time.Duration](v T) error {
	if v <= 0 {
		return Want("a positive value")
	}
	return nil
}

// NonNegative is a Check that accepts zero and numbers above it; for a
// field, zero never reaches Check (it means the default), so this rejects
// negative fields.
func NonNegative[T int | int64 | time.Duration](v T) error {
	if v < 0 {
		return Want("a value that is not negative")
	}
	return nil
}

// OneOf is a Check that accepts only the given strings.
func OneOf(values ...string) func(string) error {
	return func(s string) error {
		for _, v := range values {
			if s == v {
				return nil
			}
		}
		if len(values) == 1 {
			return Want(values[0])
		}
		return Want(strings.Join(values[:len(values)-1], ", ") + " or " + values[len(values)-1])
	}
}
