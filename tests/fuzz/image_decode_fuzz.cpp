// JPEG and PNG decoding (`--data imagefolder:DIR`): the input is an image file's bytes, decoded
// at full size and at the reduced JPEG scale a 32-pixel model input asks for.
#include <cstdint>
#include <vector>

#include "dtorch/data/image_decode.h"
#include "fuzz_support.h"

DTORCH_FUZZ_TARGET(image_decode) {
  using namespace dtorch;
  const std::vector<uint8_t> bytes(data, data + size);
  for (int64_t min_side : {0, 32}) {
    fuzz::accept_errors([&] {
      data::RgbImage image = data::decode_image(bytes, "fuzz.img", min_side);
      if (image.width <= 0 || image.height <= 0 ||
          image.pixels.size() != static_cast<size_t>(image.width * image.height * 3))
        std::abort();  // the decoder returned an image that is not what it says
    });
  }
  return 0;
}
