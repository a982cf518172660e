package disd.spark;

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The known key a misspelt one most likely means, as {@code disd.config.closest} finds it
 * (Python's {@code difflib.get_close_matches(name, known, n=1, cutoff=0.6)}), so a routing file's
 * unknown key gets the same "did you mean" here as in Python (tests/vectors/closest.json).
 */
final class Misspelt {
    private Misspelt() {
    }

    static final double CUTOFF = 0.6;

    /** The known key whose similarity to {@code name} is highest and at least {@link #CUTOFF}
     *  (ties: the greatest key), or null. */
    static String closest(String name, Collection<String> known) {
        String best = null;
        double bestScore = -1;
        for (String k : known) {
            double score = ratio(k, name);
            if (score >= CUTOFF && (score > bestScore || (score == bestScore && k.compareTo(best) > 0))) {
                best = k;
                bestScore = score;
            }
        }
        return best;
    }

    /** {@code SequenceMatcher(None, a, b).ratio()}: twice the matched characters over both
     *  lengths, the matches found as Python finds them (the longest block, earliest in a, then
     *  in b; then the same on each side of it).  Keys are short: no junk heuristics apply. */
    static double ratio(String a, String b) {
        int total = a.length() + b.length();
        if (total == 0) {
            return 1.0;
        }
        Map<Character, List<Integer>> b2j = new HashMap<>();
        for (int j = 0; j < b.length(); j++) {
            b2j.computeIfAbsent(b.charAt(j), x -> new ArrayList<>()).add(j);
        }
        return 2.0 * matched(a, b, b2j, 0, a.length(), 0, b.length()) / total;
    }

    private static int matched(String a, String b, Map<Character, List<Integer>> b2j, int alo, int ahi, int blo,
                               int bhi) {
        int besti = alo;
        int bestj = blo;
        int bestsize = 0;
        Map<Integer, Integer> j2len = new HashMap<>();
        for (int i = alo; i < ahi; i++) {
            Map<Integer, Integer> next = new HashMap<>();
            for (int j : b2j.getOrDefault(a.charAt(i), List.of())) {
                if (j < blo) {
                    continue;
                }
                if (j >= bhi) {
                    break;
                }
                int k = j2len.getOrDefault(j - 1, 0) + 1;
                next.put(j, k);
                if (k > bestsize) {
                    besti = i - k + 1;
                    bestj = j - k + 1;
                    bestsize = k;
                }
            }
            j2len = next;
        }
        if (bestsize == 0) {
            return 0;
        }
        return bestsize + matched(a, b, b2j, alo, besti, blo, bestj)
            + matched(a, b, b2j, besti + bestsize, ahi, bestj + bestsize, bhi);
    }
}
