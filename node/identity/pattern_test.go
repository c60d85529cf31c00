package identity

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

var vpcRE, attRE, nameRE = regexp.MustCompile(VPCPattern()), regexp.MustCompile(AttachmentPattern()), regexp.MustCompile(AdvertisementNamePattern())

// agree fails t unless each pattern matches s exactly when its parser
// accepts s. Go's regexp is RE2, as CEL's matches() is.
func agree(t testing.TB, s string) {
	t.Helper()
	vpc, att, name := vpcRE, attRE, nameRE
	if _, err := parseVPC(s); vpc.MatchString(s) != (err == nil) {
		t.Errorf("VPCPattern matches %q: %v; parseVPC: %v", s, vpc.MatchString(s), err)
	}
	if _, err := parseAttachment(s); att.MatchString(s) != (err == nil) {
		t.Errorf("AttachmentPattern matches %q: %v; parseAttachment: %v", s, att.MatchString(s), err)
	}
	if _, err := ParseAdvertisementName(s); name.MatchString(s) != (err == nil) {
		t.Errorf("AdvertisementNamePattern matches %q: %v; ParseAdvertisementName: %v", s, name.MatchString(s), err)
	}
}

// boundaryNumerals are numerals at and around every bound the parsers
// check, in both alphabets, bare and zero-padded to 16 and 17 characters.
func boundaryNumerals() []string {
	var out []string
	for _, n := range []uint64{0, 1, 9, 10, 15, 16, 35, 36, 61, 62, 255, 256, 3843, 3844, 65534, 65535, 65536,
		uint64(MaxVPC) - 1, uint64(MaxVPC), uint64(MaxVPC) + 1, 1<<52 - 1, 1 << 63, 1<<64 - 1} {
		for _, s := range []string{formatBase62(n, 0), strconv.FormatUint(n, 16)} {
			out = append(out, s, strings.Repeat("0", max(0, 16-len(s)))+s, strings.Repeat("0", max(0, 17-len(s)))+s)
		}
	}
	return out
}

// The generated patterns accept exactly what the parsers accept: on the
// bounds, on every string of up to three characters over an alphabet that
// reaches each character class's edges, and on random strings built from
// the bounds' own digits.
func TestPatternsAgreeWithTheParsers(t *testing.T) {
	edges := []string{"", "0", "000", "0000000000000000", "00000000000000000", "-", "a-b-c", "abc", "-1", "1-", "1--1", "1-1", "0-0", "00-0",
		"1hVwxnaA7", "1hVwxnaA8", "01hVwxnaA7", "ffffffffffff-ffff", "1000000000000-0", "ffffffffffff-10000", "h31", "h32", "1hVwxnaA7-h31",
		"1hVwxnaA7-h32", "ZZZZZZZZ-1", "zz-zz", "g-1", "G-1", "1.2-3", "1-2.", "1_2", "é-1", "1-\x00"}
	for _, s := range append(edges, boundaryNumerals()...) {
		agree(t, s)
	}
	// Every pair of them as a name, bare or padded to 16 (17 characters
	// are refused alike whichever segment carries them).
	var segs []string
	for _, s := range boundaryNumerals() {
		if len(s) <= 16 {
			segs = append(segs, s)
		}
	}
	for _, a := range segs {
		for _, b := range segs {
			agree(t, a+"-"+b)
		}
	}
	short := "019afgzAZ-.!"
	for _, s := range strings.Split(short, "") {
		agree(t, s)
		for _, u := range strings.Split(short, "") {
			agree(t, s+u)
			for _, v := range strings.Split(short, "") {
				agree(t, s+u+v)
			}
		}
	}
	// The digits of MaxVPC and MaxAttachment in base62 (1hVwxnaA7, h31) and
	// hex (ffffffffffff, ffff), their neighbours, and the separators.
	digits := "01236789afghnvwxzAUVZ-._"
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b strings.Builder
		for range r.IntN(20) {
			b.WriteByte(digits[r.IntN(len(digits))])
		}
		agree(t, b.String())
	}
	if t.Failed() {
		t.Log("the patterns: VPCPattern ", VPCPattern(), "\nAttachmentPattern ", AttachmentPattern(), "\nAdvertisementNamePattern ", AdvertisementNamePattern())
	}
}

// FuzzPatternsAgreeWithTheParsers runs agree on arbitrary strings.
func FuzzPatternsAgreeWithTheParsers(f *testing.F) {
	for _, s := range append(boundaryNumerals(), "1hVwxnaA7-h31", "ffffffffffff-ffff", "a-b-c", "") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { agree(t, s) })
}

// Rules that admission runs, each expected to be exactly the expression
// below with the generated pattern in it: a YAML edited by hand, or a bound
// changed in this package without the YAML, fails here with the expression
// to paste. Deleting a rule fails here too (the rule is not found).
func TestAdmissionRulesHoldGeneratedPatterns(t *testing.T) {
	crd := func(file string) map[string]any {
		t.Helper()
		docs := yamlDocs(t, file)
		if len(docs) != 1 {
			t.Fatalf("%s: %d documents, want one CRD", file, len(docs))
		}
		return docs[0]
	}
	schema := func(doc map[string]any) map[string]any {
		t.Helper()
		versions, _ := dig(doc, "spec", "versions").([]any)
		if len(versions) != 1 {
			t.Fatalf("CRD %v: %d versions, want one", dig(doc, "metadata", "name"), len(versions))
		}
		s, _ := dig(versions[0].(map[string]any), "schema", "openAPIV3Schema").(map[string]any)
		return s
	}
	rules := func(node any) []string {
		var out []string
		m, _ := node.(map[string]any)
		vs, _ := m["x-kubernetes-validations"].([]any)
		for _, v := range vs {
			r, _ := v.(map[string]any)["rule"].(string)
			out = append(out, r)
		}
		return out
	}
	att := schema(crd("../../deploy/crds/cloud.datumapis.com_vpcattachments.yaml"))
	adv := schema(crd("../../deploy/crds/network.datumapis.com_bgpadvertisements.yaml"))
	var policy []string
	for _, doc := range yamlDocs(t, "../../deploy/admission/policy.yaml") {
		if doc["kind"] != "ValidatingAdmissionPolicy" {
			continue
		}
		vs, _ := dig(doc, "spec", "validations").([]any)
		for _, v := range vs {
			e, _ := v.(map[string]any)["expression"].(string)
			policy = append(policy, e)
		}
	}
	for _, c := range []struct {
		where string
		got   []string
		want  string
	}{
		{"VPCAttachment CRD status.vpc", rules(dig(att, "properties", "status", "properties", "vpc")),
			"self == '' || self.matches('" + VPCPattern() + "')"},
		{"VPCAttachment CRD status.vpcAttachment", rules(dig(att, "properties", "status", "properties", "vpcAttachment")),
			"self == '' || self.matches('" + AttachmentPattern() + "')"},
		{"BGPAdvertisement CRD root", rules(adv),
			"oldSelf.hasValue() || self.metadata.name.matches('" + AdvertisementNamePattern() + "')"},
		{"deploy/admission policy", policy,
			"variables.vpc == '' || variables.vpc == variables.oldVPC || variables.vpc.matches('" + VPCPattern() + "')"},
		{"deploy/admission policy", policy,
			"variables.attachment == '' || variables.attachment == variables.oldAttachment || variables.attachment.matches('" + AttachmentPattern() + "')"},
		{"deploy/admission policy", policy,
			"variables.vpcAttachment || (oldObject != null && oldObject.metadata.name == object.metadata.name) || object.metadata.name.matches('" + AdvertisementNamePattern() + "')"},
	} {
		found := false
		for _, r := range c.got {
			found = found || r == c.want
		}
		if !found {
			t.Errorf("%s has no rule\n%s\n(it has %q)", c.where, c.want, c.got)
		}
	}
	// The CRD rule holds the string fields' own bounds; admission keeps them.
	for _, f := range []string{"vpc", "vpcAttachment"} {
		field, _ := dig(att, "properties", "status", "properties", f).(map[string]any)
		if field["maxLength"] != float64(maxRawLen) || field["pattern"] != "^[0-9a-zA-Z]*$" {
			t.Errorf("status.%s: maxLength %v pattern %v, want %d and ^[0-9a-zA-Z]*$", f, field["maxLength"], field["pattern"], maxRawLen)
		}
	}
}

func yamlDocs(t *testing.T, file string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.FromSlash(file))
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []map[string]any
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if m != nil {
			out = append(out, m)
		}
	}
}

// dig walks nested maps by key; a missing key yields nil.
func dig(m map[string]any, keys ...string) any {
	var cur any = m
	for _, k := range keys {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[k]
	}
	return cur
}
