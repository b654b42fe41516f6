# Npy.pm -- writes a .npy file (format version 1.0) without numpy: the
# helper of npy_docs.pl and npy_random.pl.
package Npy;
use strict;
use warnings;
use Exporter qw(import);
our @EXPORT_OK = qw(npy_write);

# npy_write(FILE, DESCR, PACK, [DIM...], VALUES...): VALUES, packed with
# pack(PACK), as an array of dtype DESCR ('<i4', '<f4') and that shape.
sub npy_write {
  my ($file, $descr, $pack, $shape, @values) = @_;
  my $dims = join(", ", @$shape) . (@$shape == 1 ? "," : "");
  my $header = "{'descr': '$descr', 'fortran_order': False, 'shape': ($dims), }";
  # magic (6) + version (2) + length (2) + header + newline: a multiple of 64
  my $pad = (64 - (10 + length($header) + 1) % 64) % 64;
  $header .= " " x $pad . "\n";
  open(my $fh, ">", $file) or die "$file: $!\n";
  binmode $fh;
  print $fh "\x93NUMPY\x01\x00", pack("v", length($header)), $header;
  print $fh pack($pack, @values);
  close $fh or die "$file: $!\n";
}

1;
