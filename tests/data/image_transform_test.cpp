// The transform: resizing keeps what it should, augmentation is a function of the seed,
// normalisation is exact.
#include "dtorch/data/image_transform.h"

#include <gtest/gtest.h>

#include <set>

namespace dtorch::data {
namespace {

RgbImage filled(int64_t w, int64_t h, uint8_t v) {
  RgbImage im;
  im.width = w;
  im.height = h;
  im.pixels.assign(static_cast<size_t>(w * h * 3), v);
  return im;
}

// Distinct values per pixel: x + 16 y (for images up to 16 wide).
RgbImage numbered_image(int64_t side) {
  RgbImage im;
  im.width = im.height = side;
  for (int64_t y = 0; y < side; ++y)
    for (int64_t x = 0; x < side; ++x)
      for (int c = 0; c < 3; ++c)
        im.pixels.push_back(static_cast<uint8_t>(x + 16 * y));
  return im;
}

TEST(ImageTransform, ResizeKeepsConstantsAndAspect) {
  RgbImage r = resize_shorter_side(filled(300, 200, 77), 50);
  EXPECT_EQ(r.height, 50);
  EXPECT_EQ(r.width, 75);
  for (uint8_t v : r.pixels)
    ASSERT_EQ(v, 77);
  r = resize_shorter_side(filled(10, 40, 9), 20);  // enlarging works too
  EXPECT_EQ(r.width, 20);
  EXPECT_EQ(r.height, 80);
}

TEST(ImageTransform, HalvingAveragesPairs) {
  // Columns 0,100,0,100,...: halving with the antialiasing support averages each pair.
  RgbImage im = filled(8, 8, 0);
  for (int64_t y = 0; y < 8; ++y)
    for (int64_t x = 1; x < 8; x += 2)
      for (int c = 0; c < 3; ++c)
        im.pixels[static_cast<size_t>((y * 8 + x) * 3 + c)] = 100;
  RgbImage r = resize_shorter_side(im, 4);
  for (int64_t x = 1; x < 3; ++x)  // inner columns: away from the clamped edges
    EXPECT_NEAR(r.pixels[static_cast<size_t>((1 * 4 + x) * 3)], 50, 1);
}

TEST(ImageTransform, NormalisesWithoutAugmentationExactly) {
  ImageTransform t;
  t.size = 4;
  t.mean = {0.1f, 0.2f, 0.3f};
  t.std = {0.5f, 0.25f, 2.0f};
  const RgbImage im = numbered_image(4);
  std::vector<float> out(3 * 16);
  transform_image(im, t, 123, out.data());
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 16; ++p)
      ASSERT_NEAR(out[c * 16 + p], (im.pixels[p * 3] / 255.f - t.mean[c]) / t.std[c], 1e-6);
}

TEST(ImageTransform, CentreCropsTheLongerSide) {
  ImageTransform t;
  t.size = 2;
  t.mean = {0, 0, 0};
  t.std = {1, 1, 1};
  RgbImage im = filled(6, 2, 0);  // columns 2 and 3 are the centre
  for (int64_t y = 0; y < 2; ++y)
    for (int64_t x = 2; x < 4; ++x)
      for (int c = 0; c < 3; ++c)
        im.pixels[static_cast<size_t>((y * 6 + x) * 3 + c)] = 255;
  std::vector<float> out(12);
  transform_image(im, t, 0, out.data());
  for (float v : out)
    EXPECT_FLOAT_EQ(v, 1.f);
}

TEST(ImageTransform, AugmentationIsAFunctionOfTheSeed) {
  ImageTransform t;
  t.size = 8;
  t.augment = true;
  t.pad = 2;
  const RgbImage im = numbered_image(8);
  std::vector<float> a(3 * 64), b(3 * 64);
  std::set<std::vector<float>> seen;
  for (int64_t s = 0; s < 64; ++s) {
    transform_image(im, t, sample_seed(7, 0, s), a.data());
    transform_image(im, t, sample_seed(7, 0, s), b.data());
    ASSERT_EQ(a, b);
    seen.insert(a);
  }
  EXPECT_GT(seen.size(), 20u);  // of 25 offsets x 2 flips
  EXPECT_NE(sample_seed(1, 0, 5), sample_seed(1, 1, 5));
  EXPECT_NE(sample_seed(1, 0, 5), sample_seed(2, 0, 5));
  EXPECT_NE(sample_seed(1, 0, 5), sample_seed(1, 0, 6));
}

TEST(ImageTransform, FlipMirrorsRowsAboutHalfTheTime) {
  ImageTransform t;
  t.size = 8;
  t.augment = true;
  t.pad = 0;  // no shift: each output is the image or its mirror
  const RgbImage im = numbered_image(8);
  ImageTransform still = t;
  still.augment = false;
  std::vector<float> plain(3 * 64), a(3 * 64);
  transform_image(im, still, 0, plain.data());
  int mirrored = 0, kept = 0;
  for (int64_t s = 0; s < 100; ++s) {
    transform_image(im, t, sample_seed(3, 1, s), a.data());
    bool same = true, mirror = true;
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 8; ++y)
        for (int x = 0; x < 8; ++x) {
          same &= a[(c * 8 + y) * 8 + x] == plain[(c * 8 + y) * 8 + x];
          mirror &= a[(c * 8 + y) * 8 + x] == plain[(c * 8 + y) * 8 + 7 - x];
        }
    ASSERT_TRUE(same || mirror) << "seed " << s;
    mirrored += mirror;
    kept += same;
  }
  EXPECT_GT(mirrored, 25);
  EXPECT_GT(kept, 25);
}

}  // namespace
}  // namespace dtorch::data
