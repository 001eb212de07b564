# Reads `go test -v` output and prints, for every test that failed, the
# last lines it logged, so that a log cut to its tail (CI's) still says
# why. Output switches between tests at "=== RUN", "=== CONT" and
# "=== NAME" lines; each test's lines are kept in a ring of `keep` lines.
#
#   awk -f .ci/fail-excerpt.awk e2e.log
BEGIN { keep = 40; failed = 0 }
/^=== (RUN|CONT|NAME|PAUSE)[ \t]/ { cur = $3; next }
/^[ \t]*--- FAIL: / {
	name = $3
	failed++
	printf "\n--- what %s logged last (of %d lines) ---\n", name, n[name] + 0
	from = n[name] > keep ? n[name] - keep + 1 : 1
	for (i = from; i <= n[name]; i++) print ring[name, i % keep]
	next
}
/^[ \t]*--- (PASS|SKIP): / { delete_test($3); next }
cur != "" { n[cur]++; ring[cur, n[cur] % keep] = $0 }
function delete_test(name,   i) {
	for (i = 0; i < keep; i++) delete ring[name, i]
	delete n[name]
}
END { if (failed) printf "\n%d failed test(s) above\n", failed }
