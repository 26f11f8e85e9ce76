package httpx

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"sync"
)

// Members named twice, and unknown members deep down: encoding/json keeps
// the last of two members of the same name, and matches a struct's fields
// case-insensitively, so {"name": "A", "Name": "B"} would quietly make B;
// and a type that decodes itself (quota.Optional) decodes its value without
// DisallowUnknownFields, so a misspelt override would quietly be dropped.
// DecodeJSON refuses a body that names a member twice in one object (in
// the same spelling in any object, in any case where the object is a
// struct's: a map's keys, such as a policy's exceptions, differ by case)
// or names a member a struct does not have, at any depth.

// shape is what the check needs of the Go type a body decodes into: which
// objects are structs and the shapes of what they hold. A nil *shape is a
// value whose inner objects are compared by exact name only.
type shape struct {
	fold   bool         // an object of this shape is a struct's
	fields []fieldShape // a struct's members
	elem   *shape       // a map's values, a slice's or array's elements
}

type fieldShape struct {
	name  string
	shape *shape
}

var (
	shapes          sync.Map // reflect.Type -> *shape
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
)

// shapeOf returns the shape of t, built once per type.
func shapeOf(t reflect.Type) *shape {
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	s := buildShape(t, map[reflect.Type]*shape{})
	shapes.Store(t, s)
	return s
}

func buildShape(t reflect.Type, seen map[reflect.Type]*shape) *shape {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s, ok := seen[t]; ok {
		return s
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		// quota.Optional[T] reads as its T; other types that decode
		// themselves (time.Time) hold no struct objects.
		if v, ok := optionalValue(t); ok {
			return buildShape(v, seen)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		s := &shape{fold: true}
		seen[t] = s
		s.fields = structFields(t, seen, nil)
		return s
	case reflect.Map, reflect.Slice, reflect.Array:
		s := &shape{}
		seen[t] = s
		s.elem = buildShape(t.Elem(), seen)
		return s
	}
	return nil
}

// optionalValue returns T of a quota.Optional[T]-like struct: a present
// flag Set and a pointer Value, decoding itself.
func optionalValue(t reflect.Type) (reflect.Type, bool) {
	if t.Kind() != reflect.Struct || t.NumField() != 2 {
		return nil, false
	}
	set, value := t.Field(0), t.Field(1)
	if set.Name != "Set" || set.Type.Kind() != reflect.Bool || value.Name != "Value" || value.Type.Kind() != reflect.Pointer {
		return nil, false
	}
	return value.Type.Elem(), true
}

// structFields lists the JSON members of struct t as encoding/json sees
// them, the fields of untagged embedded structs included.
func structFields(t reflect.Type, seen map[reflect.Type]*shape, out []fieldShape) []fieldShape {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := bytes.Cut([]byte(f.Tag.Get("json")), []byte(","))
		if string(name) == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && len(name) == 0 && ft.Kind() == reflect.Struct {
			out = structFields(ft, seen, out)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if len(name) == 0 {
			name = []byte(f.Name)
		}
		out = append(out, fieldShape{name: string(name), shape: buildShape(f.Type, seen)})
	}
	return out
}

// member returns the shape of the member named key of an object of s,
// and false when s is a struct without such a field.
func (s *shape) member(key []byte) (*shape, bool) {
	switch {
	case s == nil:
		return nil, true
	case !s.fold:
		return s.elem, true
	}
	var folded *shape
	found := false
	for _, f := range s.fields {
		if f.name == string(key) {
			return f.shape, true
		}
		if !found && bytes.EqualFold([]byte(f.name), key) {
			folded, found = f.shape, true
		}
	}
	return folded, found
}

// badMember returns the path ("overrides.burst", "meter_quotas[0].meter")
// of the first member of body named a second time in its object, or that
// its struct does not have (unknown true), or "". body is valid JSON
// (encoding/json decoded it).
func badMember(body []byte, root *shape) (path string, unknown bool) {
	d := scans.Get().(*dupScan)
	*d = dupScan{b: body, keys: d.keys[:0]}
	path, unknown = d.value(root), d.unknown
	clear(d.keys[:cap(d.keys)]) // keep no reference to the body
	*d = dupScan{keys: d.keys[:0]}
	scans.Put(d)
	return path, unknown
}

// scans are reused: the names of a body's members take no allocation.
var scans = sync.Pool{New: func() any { return &dupScan{keys: make([][]byte, 0, manyMembers)} }}

// dupScan reads valid JSON. keys holds the names of the members of the
// objects being read, innermost last (a stack shared by all of them).
type dupScan struct {
	b       []byte
	i       int
	keys    [][]byte
	unknown bool // the member found is unknown, not named twice
}

// manyMembers is the size past which an object's names are looked up in a
// map rather than compared one by one (a map's keys are unbounded).
const manyMembers = 16

func (d *dupScan) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// value reads one value of shape s and returns the path of a duplicate
// member in it, relative to it, or "".
func (d *dupScan) value(s *shape) string {
	d.space()
	switch d.b[d.i] {
	case '{':
		return d.object(s)
	case '[':
		d.i++
		var elem *shape
		if s != nil {
			elem = s.elem
		}
		for n := 0; ; n++ {
			d.space()
			if d.b[d.i] == ']' {
				d.i++
				return ""
			}
			if p := d.value(elem); p != "" {
				return "[" + strconv.Itoa(n) + "]" + dotted(p)
			}
			d.space()
			if d.b[d.i] == ',' {
				d.i++
			}
		}
	case '"':
		d.str()
	default: // a number, true, false or null
		for d.i < len(d.b) {
			switch d.b[d.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return ""
			}
			d.i++
		}
	}
	return ""
}

// object reads an object of shape s (at its '{').
func (d *dupScan) object(s *shape) string {
	d.i++
	mark := len(d.keys)
	defer func() { d.keys = d.keys[:mark] }()
	var many map[string]bool
	fold := s != nil && s.fold
	for {
		d.space()
		if d.b[d.i] == '}' {
			d.i++
			return ""
		}
		raw := d.str()
		key := raw
		if bytes.IndexByte(raw, '\\') >= 0 {
			var k string
			_ = json.Unmarshal(d.b[d.i-len(raw)-2:d.i], &k) // valid: encoding/json read it
			key = []byte(k)
		}
		if d.seen(d.keys[mark:], &many, key, fold) {
			return string(key)
		}
		m, ok := s.member(key)
		if !ok {
			d.unknown = true
			return string(key)
		}
		d.keys = append(d.keys, key)
		d.space()
		d.i++ // ':'
		if p := d.value(m); p != "" {
			return string(key) + dotted(p)
		}
		d.space()
		if d.b[d.i] == ',' {
			d.i++
		}
	}
}

// seen reports whether key names a member of the object already read
// (names, or many once the object has more than manyMembers of them). A
// struct's members are few: past them a member is unknown.
func (d *dupScan) seen(names [][]byte, many *map[string]bool, key []byte, fold bool) bool {
	if fold || len(names) < manyMembers {
		for _, n := range names {
			if bytes.Equal(n, key) || fold && bytes.EqualFold(n, key) {
				return true
			}
		}
		return false
	}
	if *many == nil {
		*many = make(map[string]bool, 2*len(names))
		for _, n := range names {
			(*many)[string(n)] = true
		}
	}
	if (*many)[string(key)] {
		return true
	}
	(*many)[string(key)] = true
	return false
}

// str reads a string (at its '"') and returns its bytes between the quotes.
func (d *dupScan) str() []byte {
	d.i++
	start := d.i
	for d.b[d.i] != '"' {
		if d.b[d.i] == '\\' {
			d.i++
		}
		d.i++
	}
	d.i++
	return d.b[start : d.i-1]
}

// dotted joins a member's path to its parent's: "a" + ".b", "a" + "[0]".
func dotted(p string) string {
	if p[0] == '[' {
		return p
	}
	return "." + p
}
