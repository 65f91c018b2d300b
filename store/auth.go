package store

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// SecretEnv names the environment variable that holds the shared secret of
// the optional store handshake, read by servers and clients that were given
// no Secret.
const SecretEnv = "GOCOLL_STORE_SECRET"

// The handshake, run before any query when a secret is set (gocoll only;
// PyTorch clients cannot speak it, which is why it is off by default):
//
//	client → server  authHello (8 bytes) | client nonce (32)
//	server → client  server nonce (32) | HMAC-SHA256(secret, "gocoll-store server" | cn | sn)
//	client → server  HMAC-SHA256(secret, "gocoll-store client" | sn | cn)
//	server → client  authOK (1 byte)
//
// Both sides prove knowledge of the secret with fresh nonces, so a recorded
// exchange cannot be replayed. It authenticates the peers only: the traffic
// that follows is neither encrypted nor integrity-protected.
const (
	authHello = "GCAUTH1\x00"
	authNonce = 32
	authOK    = 0xA5
	// authRefused is what a server with a secret sends, before closing,
	// to a client that opened with VALIDATE (DialectV2) instead of the
	// handshake. A gocoll client reads it where it expects the PING reply
	// and fails with ErrAuth at once instead of retrying until its
	// timeout; a PyTorch 2.x client reads a wrong PING reply and fails
	// too. A 1.x client, whose first request may expect any reply, gets
	// the bare close, so that it can never take the bytes for an answer.
	authRefused = "GCNOAUTH"
)

// ErrAuth is returned when the store handshake fails: a wrong or missing
// secret on either side.
var ErrAuth = errors.New("store: authentication failed")

func authMAC(secret []byte, label string, a, b []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(a)
	m.Write(b)
	return m.Sum(nil)
}

// authenticate runs the server side of the handshake on c.
func (c *srvConn) authenticate() error {
	secret := c.s.opts.Secret
	_ = c.nc.SetDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	defer c.nc.SetDeadline(time.Time{})
	// Refuse as soon as the bytes diverge from the hello, so that a
	// PyTorch client (which sends a few bytes and waits) is turned away at
	// once.
	for i := 1; i <= len(authHello); i++ {
		b, err := c.br.Peek(i)
		if err != nil {
			return fmt.Errorf("%w: no handshake (a client without the secret, or a PyTorch client): %w", ErrAuth, err)
		}
		if b[i-1] != authHello[i-1] {
			if b[0] == 0 {
				_, _ = c.nc.Write([]byte(authRefused))
			}
			return fmt.Errorf("%w: the client sent %x instead of the handshake (a client without the secret, or a PyTorch client)", ErrAuth, b)
		}
	}
	hello := make([]byte, len(authHello)+authNonce)
	if _, err := io.ReadFull(c.br, hello); err != nil {
		return fmt.Errorf("%w: no handshake (a client without the secret, or a PyTorch client): %w", ErrAuth, err)
	}
	if string(hello[:len(authHello)]) != authHello {
		return fmt.Errorf("%w: the client sent %x instead of the handshake (a client without the secret, or a PyTorch client)", ErrAuth, hello[:len(authHello)])
	}
	cn := hello[len(authHello):]
	sn := make([]byte, authNonce)
	_, _ = rand.Read(sn)
	msg := append(append([]byte{}, sn...), authMAC(secret, "gocoll-store server", cn, sn)...)
	if _, err := c.nc.Write(msg); err != nil {
		return fmt.Errorf("%w: write challenge: %w", ErrAuth, err)
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c.br, proof); err != nil {
		return fmt.Errorf("%w: read proof: %w", ErrAuth, err)
	}
	if !hmac.Equal(proof, authMAC(secret, "gocoll-store client", sn, cn)) {
		return fmt.Errorf("%w: the client's proof does not match the secret", ErrAuth)
	}
	if _, err := c.nc.Write([]byte{authOK}); err != nil {
		return fmt.Errorf("%w: write ok: %w", ErrAuth, err)
	}
	return nil
}

// clientAuth runs the client side of the handshake on a fresh connection.
func clientAuth(nc net.Conn, secret []byte) error {
	cn := make([]byte, authNonce)
	_, _ = rand.Read(cn)
	if _, err := nc.Write(append([]byte(authHello), cn...)); err != nil {
		return fmt.Errorf("%w: send hello: %w", ErrAuth, err)
	}
	resp := make([]byte, authNonce+sha256.Size)
	if _, err := io.ReadFull(nc, resp); err != nil {
		return fmt.Errorf("%w: no challenge from the server (a server without a secret, or a PyTorch server?): %w", ErrAuth, err)
	}
	sn := resp[:authNonce]
	if !hmac.Equal(resp[authNonce:], authMAC(secret, "gocoll-store server", cn, sn)) {
		return fmt.Errorf("%w: the server does not know the secret", ErrAuth)
	}
	if _, err := nc.Write(authMAC(secret, "gocoll-store client", sn, cn)); err != nil {
		return fmt.Errorf("%w: send proof: %w", ErrAuth, err)
	}
	var ok [1]byte
	if _, err := io.ReadFull(nc, ok[:]); err != nil || ok[0] != authOK {
		return fmt.Errorf("%w: the server refused the proof (wrong secret)", ErrAuth)
	}
	return nil
}
