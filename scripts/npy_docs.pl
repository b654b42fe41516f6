#!/usr/bin/env perl
# npy_docs.pl FILE B S LEN -- writes an int32 .npy of shape (B, S): the
# document id t / LEN of each token t, for a document mask over packed
# sequences of LEN tokens each (no numpy needed).
# npy_docs.pl FILE --offsets LEN... -- writes the int32 cu_seqlens of
# packed documents of those lengths: (0, LEN1, LEN1 + LEN2, ...).
use strict;
use warnings;
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
my $dims = $s eq "" ? "$b," : "$b, $s";
my $header = "{'descr': '<i4', 'fortran_order': False, 'shape': ($dims), }";
# magic (6) + version (2) + length (2) + header + newline: a multiple of 64
my $pad = (64 - (10 + length($header) + 1) % 64) % 64;
$header .= " " x $pad . "\n";
open(my $fh, ">", $file) or die "$file: $!\n";
binmode $fh;
print $fh "\x93NUMPY\x01\x00", pack("v", length($header)), $header;
print $fh pack("l<*", @values);
close $fh or die "$file: $!\n";
