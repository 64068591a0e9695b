package wire

// The ingest writes every receipt in one form, AppendReceipt's: its keys in
// one order, no spaces, strings of printable ASCII without escapes. Reading
// that form by hand costs a fraction of encoding/json's reflection, which
// was 44% of the Go SDK's CPU in `ledgerlab bench -only sdk` (issue 28).
// Any other form, valid or not, goes to encoding/json, so the two readers
// never disagree: FuzzDecodeReceiptsMatchesReference holds them to that.

// receiptKeys are the keys of AppendReceipt's form, each with the
// separator before it. The last two are optional.
var receiptKeys = [...]string{`{"event_id":`, `,"task":`, `,"partition":`, `,"version":`,
	`,"verdict":`, `,"reason":`, `,"seq":`, `,"generation":`, `,"current_generation":`,
	`,"fence_mode":`, `,"would_reject":`}

// receiptScanner reads receipts of AppendReceipt's form from data.
type receiptScanner struct {
	data []byte
	i    int
}

// scanReceipts reads a JSON array of receipts in AppendReceipt's form, each
// one DecodeReceipt accepts. ok is false for anything else.
func scanReceipts(data []byte) (rs []Receipt, ok bool) {
	sc := receiptScanner{data: data}
	if !sc.lit("[") {
		return nil, false
	}
	if sc.lit("]") {
		return make([]Receipt, 0), sc.i == len(data)
	}
	// A receipt takes about 200 bytes: one allocation for the slice.
	rs = make([]Receipt, 0, len(data)/160+1)
	for {
		r, ok := sc.receipt()
		if !ok {
			return nil, false
		}
		rs = append(rs, r)
		if sc.lit("]") {
			return rs, sc.i == len(data)
		}
		if !sc.lit(",") {
			return nil, false
		}
	}
}

// scanReceipt reads data as one receipt in AppendReceipt's form, one that
// DecodeReceipt accepts. ok is false for anything else.
func scanReceipt(data []byte) (Receipt, bool) {
	sc := receiptScanner{data: data}
	r, ok := sc.receipt()
	return r, ok && sc.i == len(data)
}

// receipt reads one receipt object. Its strings share one allocation, a
// copy of the object's bytes, so a kept receipt keeps no more than itself.
func (sc *receiptScanner) receipt() (Receipt, bool) {
	start := sc.i
	// The strings' places from start, by field: event_id, task, verdict,
	// reason, fence_mode, would_reject. An absent one is empty.
	var spans [6]textSpan
	var ints [5]int64 // partition, version, seq, generation, current_generation
	ok := true
	for k, key := range receiptKeys {
		if !sc.lit(key) {
			if k < len(receiptKeys)-2 {
				return Receipt{}, false
			}
			continue
		}
		switch k {
		case 0, 1:
			spans[k], ok = sc.str(start)
		case 2, 3:
			ints[k-2], ok = sc.int()
		case 4, 5:
			spans[k-2], ok = sc.str(start)
		case 6, 7, 8:
			ints[k-4], ok = sc.int()
		default:
			spans[k-5], ok = sc.str(start)
		}
		if !ok {
			return Receipt{}, false
		}
	}
	if !sc.lit("}") {
		return Receipt{}, false
	}
	text := string(sc.data[start:sc.i])
	at := func(f int) string { return text[spans[f].at:spans[f].end] }
	r := Receipt{EventID: at(0), Task: at(1), Partition: int(ints[0]), Version: ints[1],
		Verdict: Verdict(at(2)), Reason: at(3), Seq: ints[2], Generation: ints[3],
		CurrentGeneration: ints[4], FenceMode: at(4), WouldReject: at(5)}
	if int64(r.Partition) != ints[0] || !r.Verdict.Final() || r.EventID == "" {
		return Receipt{}, false // encoding/json's error, or DecodeReceipt's
	}
	return r, true
}

// lit reads s, if it comes next.
func (sc *receiptScanner) lit(s string) bool {
	if len(sc.data)-sc.i < len(s) || string(sc.data[sc.i:sc.i+len(s)]) != s {
		return false
	}
	sc.i += len(s)
	return true
}

// str reads a string of printable ASCII without escapes: its value is its
// bytes as written. Its place is counted from start.
func (sc *receiptScanner) str(start int) (textSpan, bool) {
	if !sc.lit(`"`) {
		return textSpan{}, false
	}
	at := sc.i
	for ; sc.i < len(sc.data); sc.i++ {
		switch c := sc.data[sc.i]; {
		case c == '"':
			sc.i++
			return textSpan{at - start, sc.i - 1 - start}, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return textSpan{}, false
		}
	}
	return textSpan{}, false
}

// maxReceiptDigits keeps an integer's value within int64 without a check:
// a longer one, if there ever is one, goes to encoding/json.
const maxReceiptDigits = 18

// int reads a JSON integer of at most maxReceiptDigits digits.
func (sc *receiptScanner) int() (int64, bool) {
	neg := sc.lit("-")
	at := sc.i
	var v int64
	for ; sc.i < len(sc.data) && sc.data[sc.i] >= '0' && sc.data[sc.i] <= '9'; sc.i++ {
		v = v*10 + int64(sc.data[sc.i]-'0')
	}
	n := sc.i - at
	if n == 0 || n > maxReceiptDigits || (n > 1 && sc.data[at] == '0') {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}
