#!/usr/bin/env perl
# npy_docs.pl FILE B S LEN -- writes an int32 .npy of shape (B, S): the
# document id t / LEN of each token t, for a document mask over packed
# sequences of LEN tokens each (no numpy needed).
# npy_docs.pl FILE --offsets LEN... -- writes the int32 cu_seqlens of
# packed documents of those lengths: (0, LEN1, LEN1 + LEN2, ...).
use strict;
use warnings;
use FindBin;
use lib $FindBin::Bin;
use Npy qw(npy_write);
my ($file, $b, $s, $len) = @ARGV;
my @values;
if (defined $b && $b eq "--offsets") {
  my @lens = @ARGV[2 .. $#ARGV];
  die "usage: $0 FILE --offsets LEN...\n" unless @lens;
  @values = (0);
  push @values, $values[-1] + $_ for @lens;
  ($b, $s) = (scalar(@values), "");
} else {
  die "usage: $0 FILE B S LEN\n" unless defined $len && $len > 0;
  @values = map { int(($_ % $s) / $len) } 0 .. $b * $s - 1;
}
npy_write($file, "<i4", "l<*", $s eq "" ? [$b] : [$b, $s], @values);
