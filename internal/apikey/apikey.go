// Package apikey makes and parses Tollgate API keys.
//
// A key reads "tg_" + 8 lowercase base32 characters (the visible prefix,
// unique, shown in lists) + "_" + 40 base62 characters of secret: 238 bits of
// randomness. Only the SHA-256 of the whole key is stored; the key itself is
// shown once, at creation.
//
// It stores and looks up nothing (the catalog does) and imports no package of
// Tollgate's.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"math/big"
	"strings"
)

const (
	idLen     = 8
	secretLen = 40
	// Len is the length of every key.
	Len = len("tg_") + idLen + 1 + secretLen
	// PrefixLen is the length of a key's visible prefix ("tg_xxxxxxxx").
	PrefixLen = len("tg_") + idLen
)

const (
	idAlphabet     = "abcdefghijklmnopqrstuvwxyz234567"
	secretAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
)

// Key is a freshly made key: Secret goes to the caller once, Prefix and Hash
// to the database.
type Key struct {
	Secret string
	Prefix string
	Hash   [32]byte
}

// New makes a key from crypto/rand.
func New() (Key, error) {
	id, err := randomString(idAlphabet, idLen)
	if err != nil {
		return Key{}, err
	}
	sec, err := randomString(secretAlphabet, secretLen)
	if err != nil {
		return Key{}, err
	}
	s := "tg_" + id + "_" + sec
	return Key{Secret: s, Prefix: s[:PrefixLen], Hash: sha256.Sum256([]byte(s))}, nil
}

func randomString(alphabet string, n int) (string, error) {
	var b strings.Builder
	size := big.NewInt(int64(len(alphabet)))
	for range n {
		i, err := rand.Int(rand.Reader, size)
		if err != nil {
			return "", err
		}
		b.WriteByte(alphabet[i.Int64()])
	}
	return b.String(), nil
}

// Parse checks the shape of a presented key and returns its prefix and hash.
// It does not say whether the key exists.
func Parse(s string) (prefix string, hash [32]byte, ok bool) {
	if len(s) != Len || !strings.HasPrefix(s, "tg_") || s[PrefixLen] != '_' {
		return "", hash, false
	}
	for _, r := range s[3:PrefixLen] {
		if !strings.ContainsRune(idAlphabet, r) {
			return "", hash, false
		}
	}
	for _, r := range s[PrefixLen+1:] {
		if !strings.ContainsRune(secretAlphabet, r) {
			return "", hash, false
		}
	}
	return s[:PrefixLen], sha256.Sum256([]byte(s)), true
}

// Equal compares two key hashes in constant time.
func Equal(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }
