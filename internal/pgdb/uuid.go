package pgdb

import (
	"context"
	"encoding/hex"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Tollgate passes ids as Go strings, alone or in slices bound to uuid[]
// (the worker's statements bind 2,000 of them at a time). pgx's own uuid
// codec encodes a string only in the text format, and it tries the binary
// format first for a parameter whose type the server described: for a
// []string bound to uuid[] that attempt fails after it has formatted the
// whole slice into its error, then the text format is used. That failure
// cost the worker's flush a tenth of its CPU. registerUUID gives every
// connection a uuid codec that encodes a canonical string (36 characters,
// hex and hyphens, either case) in the binary format; any other string
// falls back to the text format as before, so that Postgres still parses,
// or refuses, what the caller sent.
func registerUUID(_ context.Context, conn *pgx.Conn) error {
	m := conn.TypeMap()
	elem := &pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}}
	m.RegisterType(elem)
	m.RegisterType(&pgtype.Type{Name: "_uuid", OID: pgtype.UUIDArrayOID, Codec: &pgtype.ArrayCodec{ElementType: elem}})
	return nil
}

// uuidCodec is pgx's uuid codec, plus the binary encoding of strings.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(string); ok && format == pgtype.BinaryFormatCode {
		return encodeUUIDString{}
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

// errNotCanonicalUUID makes pgx encode the value in the text format instead.
var errNotCanonicalUUID = errors.New("pgdb: not a canonical uuid string")

type encodeUUIDString struct{}

func (encodeUUIDString) Encode(value any, buf []byte) ([]byte, error) {
	s := value.(string)
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return nil, errNotCanonicalUUID
	}
	var u [16]byte
	var digits [32]byte
	copy(digits[0:8], s[0:8])
	copy(digits[8:12], s[9:13])
	copy(digits[12:16], s[14:18])
	copy(digits[16:20], s[19:23])
	copy(digits[20:32], s[24:36])
	if _, err := hex.Decode(u[:], digits[:]); err != nil {
		return nil, errNotCanonicalUUID
	}
	return append(buf, u[:]...), nil
}
